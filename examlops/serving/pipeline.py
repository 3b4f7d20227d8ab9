"""The inference pipeline (seed 000, steps 5-8): transformer, router, hot set and predict runtime composed.

``infer`` contract: a request whose ``deadline`` (UNIX time) has passed is refused with
``DeadlineExceeded`` on entry and again just before its prediction; an unknown model is
``ModelNotFound``; a bad payload is ``InvalidInput`` (alone: the rest of its batch goes on). Requests
are validated in micro-batches (``settings.batch``); after validation each one is routed on its own
(traffic split, pin), then the requests of one batch that resolved to the same loaded version are
predicted together in ONE ``runtime.predict`` call and each caller gets its own row. A failed group
predict fails every request of that group with the same error; a transport error (a
``DependencyUnavailable``: a worker lost, a connection refused) re-routes the group up to
``settings.traffic.route_retries`` times, nothing else does (``NotReady`` is the caller's to retry). A
request in flight keeps the version it was routed to until its prediction ends, even across a reload.

Replies: a success carries model, alias, version, run id and prediction; a request pinned to a raw
version reports the alias ``"pinned"``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from examlops.core.errors import (
    DeadlineExceeded,
    DependencyUnavailable,
    ExamlopsError,
    InferenceFailed,
    InvalidInput,
    NotReady,
)
from examlops.core.messages import KNOWN_ALIASES, InferenceRequest, InferenceResult, canonical_alias
from examlops.core.settings import Settings
from examlops.registry.catalog import Catalog, ModelSpec
from examlops.serving.batcher import MicroBatcher
from examlops.serving.features import Features, validate_features
from examlops.serving.hotset import EntryInfo, HotSet, ReloadChange
from examlops.serving.metrics import PINNED_ALIAS, PipelineMetrics, outcome_of
from examlops.serving.ports import ControlEventSink, ModelSource, PredictRuntime, TrafficRuleStore
from examlops.serving.residency import Entry
from examlops.serving.router import Router, validate_split

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Reply:
    """One request's outcome inside a batch, with the alias it was routed to (for the metrics)."""

    alias: str
    result: InferenceResult | None = None
    error: BaseException | None = None


@dataclass(slots=True)
class _Job:
    index: int
    request: InferenceRequest
    spec: ModelSpec
    features: Features
    alias: str = ""


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
        self._on_event = on_event
        self._refused: dict[tuple[str, str], str | None] = {}
        self.catalog = catalog
        self._runtime = runtime
        self._clock = clock
        self._wall = wall
        self._load_retry_s = load_retry_s
        self._router = Router(rules, settings.traffic.rules_ttl_s, clock, rng)
        self._hotset = HotSet(
            catalog,
            source,
            runtime,
            aliases=settings.hotset.aliases,
            version_cache_size=settings.hotset.version_cache_size,
            clock=wall,
        )
        self._batcher: MicroBatcher[InferenceRequest, _Reply] = MicroBatcher(
            self._handle_batch,
            max_size=settings.batch.max_size,
            max_wait_s=settings.batch.max_wait_ms / 1000,
            eager_below=settings.predict.workers,
            name="feature-transformer",
        )
        self.registry = registry if registry is not None else CollectorRegistry()
        self._metrics = PipelineMetrics(self.registry, self._hotset)
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = self._ready = self._closed = False

    @property
    def ready(self) -> bool:
        """True once every model's default alias has loaded, until close (or the batching task dies)."""
        return self._ready and not self._closed and self._batcher.running

    async def start(self) -> None:
        """Start batching and load the hot set; models whose default alias failed keep retrying behind."""
        if self._started:
            return
        self._started = True
        await self._runtime.start()
        self._batcher.start()
        await self._hotset.load_all()
        self._ready = not self._hotset.missing_defaults()
        if not self._ready:
            self._spawn(self._load_missing(), "hotset-retry")
        if self.settings.hotset.reload_poll_s > 0:
            self._spawn(self._poll_reload(self.settings.hotset.reload_poll_s), "hotset-poll")

    async def close(self) -> None:
        """Stop background work and fail requests still waiting for a batch with ``NotReady``."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._batcher.close()
        await self._hotset.close()
        await self._runtime.close()

    def hot_set(self) -> list[EntryInfo]:
        return self._hotset.entries()

    def traffic(self, model: str) -> dict[str, int]:
        """The stored split of a model, read now (blocking: call it from a thread); ``StoreUnavailable``."""
        return dict(self._router.read(self.catalog.get(model).name))

    def set_traffic(self, model: str, weights: Mapping[str, int]) -> dict[str, int]:
        """Validate against the aliases the model has now, store, drop the cache (blocking: from a thread)."""
        spec = self.catalog.get(model)
        split = validate_split(weights, self._hotset.available_aliases(spec.name))
        self._router.set_rules(spec.name, split)
        self._emit("traffic.changed", spec.name, {"weights": split})
        return split

    async def reload(self, model: str | None = None) -> list[ReloadChange]:
        """Follow moved aliases now (load, swap, release); what changed, refused ones included."""
        changes = await self._hotset.reload(model)
        self._ready = self._ready or not self._hotset.missing_defaults()
        events = self._reload_events(changes)
        if events and self._on_event is not None:
            await asyncio.to_thread(self._emit_all, events)
        return changes

    def _reload_events(self, changes: list[ReloadChange]) -> list[tuple[str, str, dict[str, Any]]]:
        """Control events of a reload: every swap, and a refusal once per refused version (polls retry it)."""
        events: list[tuple[str, str, dict[str, Any]]] = []
        for change in changes:
            slot = (change.model, change.alias)
            data: dict[str, Any] = {
                "alias": change.alias,
                "old_version": change.old_version,
                "new_version": change.new_version,
                "outcome": change.outcome,
            }
            if change.outcome == "refused":
                if self._refused.get(slot) != change.new_version:
                    self._refused[slot] = change.new_version
                    events.append(("reload.refused", change.model, {**data, "reason": change.reason}))
            elif change.outcome in ("swapped", "loaded", "removed"):
                self._refused.pop(slot, None)
                events.append(("model.reloaded", change.model, data))
        return events

    def _emit_all(self, events: list[tuple[str, str, dict[str, Any]]]) -> None:
        for event in events:
            self._emit(*event)

    def _emit(self, type: str, subject: str, data: dict[str, Any]) -> None:
        """Hand one control action to the sink (blocking: from a thread); a failing sink never fails the action."""
        if self._on_event is None:
            return
        try:
            self._on_event(type, subject, data)
        except Exception as exc:  # the audit trail's store is down: say so once per event, no traceback
            log.error("could not record the control event %s of %s: %s", type, subject, exc)

    async def infer(self, req: InferenceRequest) -> InferenceResult:
        started = self._clock()
        model, alias = "unknown", "other"
        self._metrics.in_flight.inc()
        try:
            spec = self.catalog.get(req.model)
            model = spec.name
            alias = self._label(spec.name, PINNED_ALIAS if req.version is not None else req.alias or spec.default_alias)
            if req.alias is not None and req.version is not None:
                raise InvalidInput("give either alias or version, not both", field="version")
            self._check_deadline(req)
            if not self._started or self._closed:
                raise NotReady("the pipeline is not started")
            reply = await self._batcher.submit(req)
            alias = self._label(model, reply.alias) if reply.alias else alias
            if reply.error is not None:
                raise reply.error
            assert reply.result is not None
            self._metrics.requests.labels(model, alias, "ok").inc()
            return reply.result
        except Exception as exc:
            self._metrics.requests.labels(model, alias, outcome_of(exc)).inc()
            raise
        finally:
            self._metrics.in_flight.dec()
            self._metrics.latency.labels(model, alias).observe(self._clock() - started)

    def _label(self, model: str, alias: str) -> str:
        """An alias label from a bounded set: names nobody serves would grow the series without end."""
        alias = canonical_alias(alias)
        bounded = alias in (*KNOWN_ALIASES, PINNED_ALIAS) or alias in self._hotset.available_aliases(model)
        return alias if bounded else "other"

    def _check_deadline(self, req: InferenceRequest) -> None:
        if req.deadline is not None and self._wall() >= req.deadline:
            raise DeadlineExceeded("the caller's deadline passed before the prediction ran")

    async def _handle_batch(self, batch: Sequence[InferenceRequest]) -> list[_Reply]:
        self._metrics.batch_size.observe(len(batch))
        specs = [self.catalog.get(req.model) for req in batch]
        replies: list[_Reply | None] = [None] * len(batch)
        jobs: list[_Job] = []
        for i, checked in enumerate(validate_features(batch, specs)):
            if isinstance(checked, InvalidInput):
                replies[i] = _Reply("", error=checked)  # not routed: infer keeps the requested alias
            else:
                jobs.append(_Job(i, batch[i], specs[i], checked))
        await self._router.refresh_stale({job.spec.name for job in jobs})
        retries = self.settings.traffic.route_retries
        for attempt in range(retries + 1):
            if not jobs:
                break
            jobs = await self._attempt(jobs, replies, last=attempt == retries)
        return [
            reply if reply is not None else _Reply("other", error=InferenceFailed("no outcome")) for reply in replies
        ]

    async def _attempt(self, jobs: list[_Job], replies: list[_Reply | None], *, last: bool) -> list[_Job]:
        """Route each job on its own, predict each group of one version once; returns the jobs to retry."""
        for job in jobs:
            req = job.request
            if req.version is not None:
                job.alias = PINNED_ALIAS
            else:
                job.alias = self._router.choose(job.spec, req.alias, self._hotset.available_aliases(job.spec.name))
        entries = await asyncio.gather(
            *(self._acquire(job) for job in jobs),
            return_exceptions=True,
        )
        groups: dict[str, list[tuple[_Job, Entry]]] = {}
        retry: list[_Job] = []
        for job, entry in zip(jobs, entries, strict=True):
            if isinstance(entry, BaseException):
                retry += self._settle([job], entry, replies, last=last)
            else:
                groups.setdefault(entry.key, []).append((job, entry))
        for again in await asyncio.gather(
            *(self._predict_group(key, members, replies, last=last) for key, members in groups.items())
        ):
            retry += again
        return retry

    def _acquire(self, job: _Job) -> Coroutine[Any, Any, Entry]:
        if job.request.version is not None:
            return self._hotset.acquire(job.spec.name, version=job.request.version)
        return self._hotset.acquire(job.spec.name, job.alias)

    async def _predict_group(
        self, key: str, members: list[tuple[_Job, Entry]], replies: list[_Reply | None], *, last: bool
    ) -> list[_Job]:
        try:
            live: list[tuple[_Job, Entry]] = []
            for job, entry in members:
                try:
                    self._check_deadline(job.request)
                    live.append((job, entry))
                except DeadlineExceeded as exc:
                    replies[job.index] = _Reply(job.alias, error=exc)
            if not live:
                return []
            rows = np.stack([job.features.row for job, _ in live])
            try:
                predictions = np.asarray(await self._runtime.predict(key, rows), dtype=np.float64).reshape(-1)
                if predictions.shape[0] != len(live):
                    raise InferenceFailed(f"{key} returned {predictions.shape[0]} predictions for {len(live)} rows")
            except Exception as exc:
                return self._settle([job for job, _ in live], exc, replies, last=last)
            for (job, entry), value in zip(live, predictions, strict=True):
                replies[job.index] = self._result(job, entry, float(value))
            return []
        finally:
            for _, entry in members:
                self._hotset.release(entry)

    def _result(self, job: _Job, entry: Entry, value: float) -> _Reply:
        if not np.isfinite(value):
            return _Reply(job.alias, error=InferenceFailed(f"{entry.key} returned no finite prediction"))
        ref = entry.ref
        result = InferenceResult(job.spec.name, job.alias, ref.version, ref.run_id, value, job.request.job_id)
        return _Reply(job.alias, result=result)

    @staticmethod
    def _settle(jobs: list[_Job], exc: BaseException, replies: list[_Reply | None], *, last: bool) -> list[_Job]:
        """Fail ``jobs`` with ``exc``, or hand them back for another route after a transport error."""
        if isinstance(exc, DependencyUnavailable) and not last:
            return jobs
        if not isinstance(exc, ExamlopsError):
            log.error("prediction failed unexpectedly", exc_info=exc)
            wrapped = InferenceFailed(f"the prediction failed ({type(exc).__name__})")
            wrapped.__cause__ = exc
            exc = wrapped
        for job in jobs:
            replies[job.index] = _Reply(job.alias, error=exc)
        return []

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _load_missing(self) -> None:
        """Retry the models whose default alias is not loaded, with capped exponential backoff."""
        delay = self._load_retry_s
        while missing := self._hotset.missing_defaults():
            await asyncio.sleep(delay)
            await asyncio.gather(*(self._hotset.load_model(name) for name in missing))
            delay = min(delay * 2, 30.0)
        self._ready = True

    async def _poll_reload(self, every_s: float) -> None:
        """Follow moved aliases every ``every_s``; while the registry is unreachable, back off.

        One reload at a time: the next wait starts when the last reload ended, so a registry that
        hangs (MLflow retries for a long while) never piles calls up, and the calls themselves run
        in threads, off the event loop. Each poll that finds the registry unreachable doubles the
        wait, up to ``poll_backoff_ceiling(every_s)``; the first poll that reaches it resets it.
        """
        delay, ceiling = every_s, poll_backoff_ceiling(every_s)
        while True:
            await asyncio.sleep(delay)
            try:
                changes = await self.reload()
            except Exception:
                log.exception("polling the registry for moved aliases failed")
                changes, unreachable = [], True
            else:
                unreachable = any(change.outcome == "unreachable" for change in changes)
            if unreachable:
                delay = min(delay * 2, ceiling)
                log.warning("the model registry is unreachable; serving what is loaded, next poll in %g s", delay)
            else:
                delay = every_s
            for change in changes:
                if change.outcome != "unreachable":
                    log.info(
                        "reload %s@%s: %s %s -> %s",
                        change.model,
                        change.alias,
                        change.outcome,
                        change.old_version,
                        change.new_version,
                    )


def poll_backoff_ceiling(every_s: float) -> float:
    """The longest wait between polls while the registry is unreachable: 8 intervals, at most 10 minutes
    (but never less than one interval)."""
    return max(every_s, min(every_s * 8, 600.0))
