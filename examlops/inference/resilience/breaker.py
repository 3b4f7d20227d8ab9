"""A circuit breaker for one route: closed, open (fail fast), half-open (a few probes), closed again.

- **Closed** lets every call through and keeps the outcomes of the last ``window_s`` seconds. It opens when
  the counted failures (``failure_kinds``, the retryable kinds by default) in the window reach
  ``failure_threshold``, or when at least ``min_calls`` calls were made and ``failure_ratio`` of them failed.
- **Open** refuses every call at once with ``InferenceError(INFRASTRUCTURE, code="inference_circuit_open")``
  whose ``retry_after_s`` is the time left until half-open; the backend sees nothing.
- **Half-open** (``open_s`` after opening) lets at most ``half_open_probes`` calls through at a time. The
  first probe that succeeds closes the breaker with an empty window; a probe that fails reopens it for
  another ``open_s``. A probe that ends neither way (cancelled, timed out) frees its place.

An answer of another kind (validation, model failure) shows the backend is up and counts as a success.
A disabled breaker (``enabled: false``) lets everything through and counts nothing.
The breaker is not thread-safe: it belongs to one event loop. Time comes from the injected clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from enum import StrEnum

from examlops.inference.errors import InferenceError, Kind
from examlops.inference.resilience.policy import BreakerPolicy

CIRCUIT_OPEN = "inference_circuit_open"


class State(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Outcome(StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    NEUTRAL = "neutral"
    """Says nothing of the backend: cancelled, or the caller's deadline ran out."""


def outcome_of(error: BaseException | None, failure_kinds: frozenset[Kind]) -> Outcome:
    """How a finished call counts for the breaker."""
    if error is None:
        return Outcome.SUCCESS
    if isinstance(error, InferenceError):
        if error.kind in failure_kinds:
            return Outcome.FAILURE
        return Outcome.NEUTRAL if error.kind is Kind.TIMEOUT else Outcome.SUCCESS
    return Outcome.NEUTRAL


class CircuitBreaker:
    """The breaker of one route; see the module docstring."""

    def __init__(self, policy: BreakerPolicy, *, route: str, backend: str, clock: Callable[[], float]) -> None:
        self._policy = policy
        self._route = route
        self._backend = backend
        self._clock = clock
        self._state = State.CLOSED
        self._outcomes: deque[tuple[float, bool]] = deque()  # (when, failed) while closed
        self._opened_at = 0.0
        self._probes = 0

    @property
    def state(self) -> State:
        if self._state is State.OPEN and self._clock() >= self._opened_at + self._policy.open_s:
            self._state = State.HALF_OPEN
            self._probes = 0
        return self._state

    def admit(self) -> bool:
        """Let one call through, or raise ``inference_circuit_open``; True when the call is a probe."""
        if not self._policy.enabled:
            return False
        state = self.state
        if state is State.CLOSED:
            return False
        if state is State.HALF_OPEN and self._probes < self._policy.half_open_probes:
            self._probes += 1
            return True
        wait = self._opened_at + self._policy.open_s - self._clock()
        raise InferenceError(
            Kind.INFRASTRUCTURE,
            f"the circuit of route {self._route!r} is {state.value}: failing fast",
            code=CIRCUIT_OPEN,
            backend=self._backend,
            route=self._route,
            retry_after_s=max(0.0, wait),
        )

    def record(self, outcome: Outcome, *, probe: bool) -> None:
        """The outcome of a call that ``admit`` let through (``probe`` as it said)."""
        if not self._policy.enabled:
            return
        if probe:
            self._record_probe(outcome)
        elif self._state is State.CLOSED and outcome is not Outcome.NEUTRAL:
            self._record_closed(outcome is Outcome.FAILURE)

    def _record_probe(self, outcome: Outcome) -> None:
        if self._state is not State.HALF_OPEN:
            return  # another probe decided already
        self._probes = max(0, self._probes - 1)
        if outcome is Outcome.SUCCESS:
            self._state = State.CLOSED
            self._outcomes.clear()
        elif outcome is Outcome.FAILURE:
            self._open()

    def _record_closed(self, failed: bool) -> None:
        now = self._clock()
        self._outcomes.append((now, failed))
        horizon = now - self._policy.window_s
        while self._outcomes and self._outcomes[0][0] < horizon:
            self._outcomes.popleft()
        if not failed:
            return
        failures = sum(1 for _, f in self._outcomes if f)
        calls = len(self._outcomes)
        ratio = self._policy.failure_ratio
        if failures >= self._policy.failure_threshold or (
            ratio is not None and calls >= self._policy.min_calls and failures / calls >= ratio
        ):
            self._open()

    def _open(self) -> None:
        self._state = State.OPEN
        self._opened_at = self._clock()
        self._outcomes.clear()
        self._probes = 0
