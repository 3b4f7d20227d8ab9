"""The inference pipeline (seed 000, steps 5-8): transformer, router, hot set and predict runtime composed.

``infer`` contract: a request whose ``deadline`` (UNIX time) has passed on entry is ``DeadlineExceeded``,
or ``Refused`` (reason ``budget``) when it declared a budget (a refusal, not an error, for a budgeted call);
one that has a deadline is admitted only when the estimate (``admission``) says it can be answered by
then, else ``Refused`` (reason ``budget``) at once, before it is queued. A call of many rows sent apart (a
stream) is admitted once, before any row is sent (``admit``), and its rows come ``admitted``: none of them
is refused early on its own. Queued requests wait in deadline order; one whose deadline comes while it
waits, or (with admission on) would come before a batch of it alone is answered, never reaches a worker:
``Refused`` (reason ``late``).
``background=True`` work (offline jobs) queues behind every interactive call and is never refused early.
Every refusal notes the refused call's ``budget_ms`` and deadline (``Refused.of_call``) for its reply.
An unknown model is ``ModelNotFound``; alias and version together are ``InvalidInput``. Requests are validated in
micro-batches (``settings.batch``, ``batcher``), then routed and predicted per batch as ``dispatch``
says: one predict call per loaded version, a bad payload fails alone, a failed predict fails its group,
and only transport errors re-route (up to ``settings.traffic.route_retries`` times).

Replies: a success carries model, alias, version, run id and prediction; a pinned request reports the
alias ``"pinned"``. ``start`` (and each ``reload``) loads; an alias whose load failed, or a default alias
not in the registry yet, keeps loading behind (``upkeep``); ``ready`` once every default alias is loaded.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence

from prometheus_client import CollectorRegistry

from examlops.core.backoff import Backoff
from examlops.core.errors import InvalidInput, NotReady, Refused
from examlops.core.messages import KNOWN_ALIASES, InferenceRequest, InferenceResult, canonical_alias
from examlops.core.settings import Settings
from examlops.registry.catalog import Catalog
from examlops.serving.admission import Estimator
from examlops.serving.batcher import MicroBatcher
from examlops.serving.control_events import ControlEvents
from examlops.serving.dispatch import Dispatcher, Reply, check_deadline, predict_capacity
from examlops.serving.hotset import EntryInfo, HotSet, ReloadChange
from examlops.serving.metrics import PINNED_ALIAS, PipelineMetrics, outcome_of
from examlops.serving.ports import ControlEventSink, ModelSource, PredictRuntime, TrafficRuleStore
from examlops.serving.router import Router, validate_split
from examlops.serving.upkeep import Upkeep


def _model_of(req: InferenceRequest) -> str:
    return req.model.lower()  # names match case-insensitively


def _late(req: InferenceRequest) -> Refused:
    return Refused("the budget ran out, or would before an answer, while queued; the call was not run", reason="late")


class Pipeline:
    """The serving core the HTTP app and the bus bridge call (contract above)."""

    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        source: ModelSource,
        rules: TrafficRuleStore,
        runtime: PredictRuntime,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        registry: CollectorRegistry | None = None,
        load_retry_s: float = 1.0,
        on_event: ControlEventSink | None = None,
    ) -> None:
        self.settings = settings
        self._events = ControlEvents(on_event)
        self.catalog = catalog
        self._runtime = runtime
        self._clock = clock
        self._wall = wall
        self._router = Router(rules, settings.traffic.rules_ttl_s, clock, rng)
        self._hotset = HotSet(
            catalog,
            source,
            runtime,
            aliases=settings.hotset.aliases,
            version_cache_size=settings.hotset.version_cache_size,
            clock=wall,
        )
        # Load retries capped at 30 s: a model whose default alias appears later starts serving within half a minute.
        self._upkeep = Upkeep(self._hotset, Backoff(load_retry_s, max(load_retry_s, 30.0)))
        capacity = predict_capacity(runtime, settings.predict.workers)
        per_model, workers = capacity.per_model, capacity.workers
        self._batcher: MicroBatcher[InferenceRequest, Reply] = MicroBatcher(
            self._handle_batch,
            max_size=settings.batch.max_size,
            max_wait_s=settings.batch.max_wait_ms / 1000,
            eager_below=workers,
            # A batch per worker: the rest wait here, where deadlines order them and expired calls are dropped.
            max_in_flight=workers,
            horizon_s=settings.admission.horizon_s,
            expired=_late,
            lead=self._lead_s,
            early_expiry=settings.admission.enabled,
            group=_model_of if per_model else None,
            tally=_model_of,  # one tally per catalog model, however a call spells its name
            name="feature-transformer",
        )
        self.estimator = Estimator(
            settings.admission, self._batcher, workers=workers, max_size=settings.batch.max_size, per_model=per_model
        )
        self._dispatcher = Dispatcher(
            catalog, self._router, self._hotset, runtime, route_retries=settings.traffic.route_retries, wall=wall,
            on_predict=self.estimator.costs.observe, capacity=capacity, clock=clock,
        )  # fmt: skip
        self.registry = registry if registry is not None else CollectorRegistry()
        self._metrics = PipelineMetrics(self.registry, self._hotset)
        self._started = self._closed = False
        self._calls = 0
        self._metrics.in_flight.set_function(lambda: self._calls)  # read at each scrape

    @property
    def ready(self) -> bool:
        """True once every model's default alias has loaded, until close (or the batching task dies)."""
        return self._upkeep.ready and not self._closed and self._batcher.running

    @property
    def in_flight(self) -> int:
        """Calls inside ``infer`` now: waiting, being predicted or being answered."""
        return self._calls

    async def start(self) -> None:
        """Start batching and load the hot set; aliases whose load failed keep retrying behind."""
        if self._started:
            return
        self._started = True
        await self._runtime.start()
        self._batcher.start()
        await self._hotset.load_all()
        self._upkeep.start(self.reload, self.settings.hotset.reload_poll_s)

    async def close(self) -> None:
        """Stop background work and fail requests still waiting for a batch with ``NotReady``."""
        self._closed = True
        await self._upkeep.close()
        await self._batcher.close()
        await self._hotset.close()
        await self._runtime.close()

    def hot_set(self) -> list[EntryInfo]:
        return self._hotset.entries()

    def traffic(self, model: str) -> dict[str, int]:
        """The stored split of a model, read now (blocking: call it from a thread); ``StoreUnavailable``."""
        return dict(self._router.read(self.catalog.get(model).name))

    def check_traffic(self, model: str, weights: Mapping[str, int]) -> dict[str, int]:
        """The split ``set_traffic`` would store: ``validate_split`` against the aliases the model has now
        (``InvalidInput``; ``ModelNotFound``). Stores and records nothing, and never blocks."""
        return validate_split(weights, self._hotset.available_aliases(self.catalog.get(model).name))

    def set_traffic(self, model: str, weights: Mapping[str, int], actor: str = "system:serving") -> dict[str, int]:
        """``check_traffic``, then ``ControlEvents.change_traffic``: the ``traffic.changed`` event naming ``actor``
        first, then the split stored; no event, no change (``StoreUnavailable``). Blocking: from a thread."""
        name = self.catalog.get(model).name
        split = self.check_traffic(name, weights)
        self._events.change_traffic(name, split, actor, lambda: self._router.set_rules(name, split))
        return split

    async def reload(self, model: str | None = None, *, actor: str = "system:reload-poll") -> list[ReloadChange]:
        """Follow moved aliases now (load, swap, release); what changed, refused ones included, each event
        naming ``actor`` (who asked; the poll by default)."""
        changes = await self._hotset.reload(model)
        self._upkeep.reloaded()
        await self._events.reloaded(changes, actor)  # every swap; a refusal once per refused version
        return changes

    async def route(self, model: str, alias: str | None = None) -> str:
        """The alias answering every row of one call to ``model`` (drawn once from the split for None or the
        default alias, else ``alias``); rows sent with it and ``routed=True`` skip the draw. ``ModelNotFound``."""
        spec = self.catalog.get(model)
        await self._router.refresh_stale({spec.name})
        return self._router.choose(spec, alias, self._hotset.available_aliases(spec.name))

    def admit(self, req: InferenceRequest, rows: int = 1) -> float | None:
        """Admission of a call of ``rows`` rows like ``req`` before any is sent (a stream's first chunk): the
        estimate (ms), None without a deadline; ``Refused`` (``budget``) at once otherwise, counted as
        ``infer``'s refusals are. Rows then sent with ``admitted=True`` are not estimated again."""
        model, alias = "unknown", "other"
        try:
            model, alias = self._labels(req)
            self._enter(req)
            now = asyncio.get_running_loop().time()
            due = self._due(req, now)
            return None if due is None else self.estimator.admit(model, due, now, rows)
        except Exception as exc:
            self._metrics.requests.labels(model, alias, outcome_of(exc)).inc()
            if isinstance(exc, Refused):
                self._note_refusal(exc, req, model)
            raise

    def _labels(self, req: InferenceRequest) -> tuple[str, str]:
        """The model's catalog name and the alias label of ``req``; ``ModelNotFound`` for an unknown model."""
        spec = self.catalog.get(req.model)
        alias = PINNED_ALIAS if req.version is not None else req.alias or spec.default_alias
        return spec.name, self._label(spec.name, alias)

    def _enter(self, req: InferenceRequest) -> None:
        """Raise what keeps ``req`` out (the contract above); nothing when it may enter."""
        if req.alias is not None and req.version is not None:
            raise InvalidInput("give either alias or version, not both", field="version")
        if req.budget_ms is not None and req.deadline is not None and req.deadline <= self._wall():
            raise Refused("the budget ran out before the call reached serving's queue", reason="budget")
        check_deadline(req, self._wall())
        if not self._started or self._closed:
            raise NotReady("the pipeline is not started")

    def _due(self, req: InferenceRequest, now: float) -> float | None:
        """``req``'s deadline on the loop's clock (``now`` is its time), None without one."""
        return None if req.deadline is None else now + (req.deadline - self._wall())

    def _note_refusal(self, exc: Refused, req: InferenceRequest, model: str) -> None:
        exc.of_call(req.budget_ms, req.deadline)  # the refusal says what remained, as an answer does
        when = "early" if exc.reason == "budget" else "late"
        self._metrics.refusals.labels(model, req.task or "", req.identity or "", when).inc()

    async def infer(self, req: InferenceRequest, *, background: bool = False) -> InferenceResult:
        started = self._clock()
        model, alias = "unknown", "other"
        now, due, estimate = 0.0, None, None
        self._calls += 1
        try:
            model, alias = self._labels(req)
            self._enter(req)
            if req.facts is not None:
                req.facts.queued_at = self._clock()
            now = asyncio.get_running_loop().time()
            due = self._due(req, now)
            if due is not None and not background and not req.admitted:
                estimate = self.estimator.admit(model, due, now)
            reply = await self._submit(req, due, background)
            alias = self._label(model, reply.alias) if reply.alias else alias
            if reply.error is not None:
                # Raised fresh (one error may answer a whole group) and with no name left here for it: its
                # traceback keeps this frame, and a reference back would make a cycle only a collection frees.
                error = reply.error.with_traceback(None)
                try:
                    raise error
                finally:
                    del error, reply
            assert reply.result is not None
            self._metrics.requests.labels(model, alias, "ok").inc()
            if estimate is not None:
                done = asyncio.get_running_loop().time()
                error_ms = (done - now) * 1000.0 - estimate
                self._metrics.estimate_error.labels(model).observe(error_ms)
                self.estimator.observe_error(model, error_ms, done, estimate_ms=estimate)
            return reply.result
        except Exception as exc:
            self._metrics.requests.labels(model, alias, outcome_of(exc)).inc()
            if isinstance(exc, Refused):
                self._note_refusal(exc, req, model)
                if exc.reason == "late" and estimate is not None and due is not None:
                    late_ms = (due - now) * 1000.0 - estimate  # at least this late
                    self.estimator.observe_error(model, late_ms, due, estimate_ms=estimate)
            raise
        finally:
            self._calls -= 1
            self._metrics.latency.labels(model, alias).observe(self._clock() - started)

    def _label(self, model: str, alias: str) -> str:
        """An alias label from a bounded set: names nobody serves would grow the series without end."""
        alias = canonical_alias(alias)
        bounded = alias in (*KNOWN_ALIASES, PINNED_ALIAS) or alias in self._hotset.available_aliases(model)
        return alias if bounded else "other"

    async def _handle_batch(self, batch: Sequence[InferenceRequest]) -> list[Reply]:
        self._metrics.batch_size.observe(len(batch))
        now = self._clock()
        for facts in (req.facts for req in batch if req.facts is not None):
            facts.queue_wait_ms = (now - facts.queued_at) * 1000
        return await self._dispatcher.handle(batch)

    async def _submit(self, req: InferenceRequest, due: float | None, background: bool) -> Reply:
        """The request's reply from the batcher; ``Refused`` (late) at its deadline if none came by then (a
        request still queued is dropped, one being predicted is not waited for)."""
        submitted = self._batcher.submit(req, due=due, key=math.inf if background else None)
        if due is None:
            return await submitted
        try:
            async with asyncio.timeout_at(due):
                return await submitted
        except TimeoutError:
            pass
        # Raised outside the handler: no context to keep the timeout, whose frame keeps this task (a cycle).
        raise _late(req)

    def _lead_s(self, batch: Sequence[InferenceRequest]) -> float:
        """Seconds the batcher must flush ``batch`` ahead of its tightest deadline: its predict time."""
        return (self.estimator.costs.lead_ms(batch) + self.settings.admission.overhead_ms) / 1000.0
