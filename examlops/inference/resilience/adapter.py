"""``ResilientAdapter``: a policy around any adapter, itself an adapter, so the port needs no change.

Wiring wraps each adapter it builds (``ResilientAdapter(inner, policy)``) and the port calls it like any
other; ``backend`` and ``capabilities`` are the inner adapter's. Per route it keeps a circuit breaker, a
shedder and a hedger (with the route's latency estimate), created on the route's first call.

``predict_batch`` runs, outermost first:

1. **retry** (``retry.py``): a whole ``predict_batch`` again after a throttled or infrastructure failure,
   never past ``call.deadline``. Our own fail-fast refusals (``inference_circuit_open``,
   ``inference_shed``) are not retried, nor a failure after which this call would be shed anyway.
2. per attempt, **shedding** (``shedding.py``) by ``call.criticality``, then the **breaker**
   (``breaker.py``), both failing before any I/O;
3. **hedging** (``hedge.py``) of the inner ``predict_batch``.

``stream_batches`` gets the breaker only: a partially consumed stream cannot be replayed, so it is never
retried, hedged, shed or timed out here (the inner adapter still checks the deadline at every chunk).
So does a ``predict_batch`` whose ``call.stream`` is set: a chunk of a stream the port emulates over
``predict_batch`` (``emulate_streaming``), which the same promise covers. An
inner adapter without streaming refuses it with ``inference_feature_unsupported`` before any I/O.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from examlops.inference.errors import FeatureUnsupported, InferenceError, Kind
from examlops.inference.ports import Adapter, Call, Capabilities, Row
from examlops.inference.resilience.breaker import CIRCUIT_OPEN, CircuitBreaker, State, outcome_of
from examlops.inference.resilience.hedge import Hedger
from examlops.inference.resilience.policy import Policy
from examlops.inference.resilience.retry import retry_call
from examlops.inference.resilience.shedding import SHED, Shedder


@dataclass(slots=True)
class RouteGuard:
    """What the policy keeps for one route."""

    breaker: CircuitBreaker
    shedder: Shedder
    hedger: Hedger

    def typical_s(self) -> float:
        """The route's median latency so far (0 before any), what a retry must leave time for."""
        return self.hedger.latency.quantile(0.5) or 0.0

    @property
    def half_open(self) -> bool:
        return self.breaker.state is State.HALF_OPEN


class ResilientAdapter:
    """An ``Adapter`` that runs ``inner`` under ``policy``; see the module docstring."""

    def __init__(
        self,
        inner: Adapter,
        policy: Policy,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``clock`` must be the clock of ``Call.deadline`` (``time.monotonic`` in production)."""
        self.inner = inner
        self.policy = policy
        self.backend: str = inner.backend
        self.capabilities: Capabilities = inner.capabilities
        self._clock = clock
        self._sleep = sleep
        self._routes: dict[str, RouteGuard] = {}

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    def guard(self, route: str) -> RouteGuard:
        """The route's breaker, shedder and hedger (made on first use)."""
        found = self._routes.get(route)
        if found is None:
            found = RouteGuard(
                breaker=CircuitBreaker(self.policy.breaker, route=route, backend=self.backend, clock=self._clock),
                shedder=Shedder(self.policy.shedding, route=route, backend=self.backend, clock=self._clock),
                hedger=Hedger(self.policy.hedge, self._clock),
            )
            self._routes[route] = found
        return found

    async def predict_batch(self, route: str, rows: Sequence[Row], call: Call) -> Sequence[Row]:
        guard = self.guard(route)
        if call.stream:
            return await self._breaker_only(guard, route, rows, call)

        def should_retry(error: InferenceError) -> bool:
            if error.code in (CIRCUIT_OPEN, SHED) or not error.retryable:
                return False
            return not guard.shedder.sheds(call.criticality, half_open=guard.half_open)

        return await retry_call(
            lambda: self._attempt(guard, route, rows, call),
            self.policy.retry,
            deadline=call.deadline,
            clock=self._clock,
            expected_s=guard.typical_s,
            should_retry=should_retry,
            sleep=self._sleep,
        )

    async def _attempt(self, guard: RouteGuard, route: str, rows: Sequence[Row], call: Call) -> Sequence[Row]:
        guard.shedder.check(call.criticality, half_open=guard.half_open)
        probe = guard.breaker.admit()
        error: BaseException | None = None
        try:
            return await guard.hedger.run(lambda: self.inner.predict_batch(route, rows, call), call.deadline)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._observe(guard, error, probe)

    async def _breaker_only(self, guard: RouteGuard, route: str, rows: Sequence[Row], call: Call) -> Sequence[Row]:
        """One chunk of an emulated stream: the breaker, nothing else (see ``stream_batches``)."""
        probe = guard.breaker.admit()
        error: BaseException | None = None
        try:
            return await self.inner.predict_batch(route, rows, call)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._observe(guard, error, probe)

    async def stream_batches(self, route: str, rows: Sequence[Row], call: Call) -> AsyncIterator[Sequence[Row]]:
        stream: Any = getattr(self.inner, "stream_batches", None)
        if not self.capabilities.streaming or stream is None:
            raise FeatureUnsupported("streaming", backend=self.backend, route=route)
        guard = self.guard(route)
        probe = guard.breaker.admit()
        error: BaseException | None = None
        try:
            chunks: AsyncIterator[Sequence[Row]] = stream(route, rows, call)
            async for chunk in chunks:
                yield chunk
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._observe(guard, error, probe)

    def _observe(self, guard: RouteGuard, error: BaseException | None, probe: bool) -> None:
        if isinstance(error, InferenceError) and error.kind is Kind.THROTTLED:
            guard.shedder.note_throttled()
        guard.breaker.record(outcome_of(error, self.policy.breaker.failure_kinds), probe=probe)
