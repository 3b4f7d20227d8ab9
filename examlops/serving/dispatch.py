"""One validated batch routed and predicted (seed 000, steps 6-8): the feature transformer's handler.

Contract of ``Dispatcher.handle``: one ``Reply`` per request, in order. A bad payload gets its
``InvalidInput`` alone; the others are routed each on its own (traffic split, pin, or the alias a
``routed`` request already carries, so the rows of one call share one alias), then the requests
that resolved to the same loaded version are predicted together in ONE ``runtime.predict`` call and
each gets its own row. A predict call waits for a slot (``Capacity``: one of the predict pool's workers,
shared by all models; or, on Ray, one of its model's own replicas) before it checks its requests'
deadlines: a request whose ``deadline`` passed by then is not predicted, ``Refused``
(reason ``late``), so no expired request reaches a worker (short of one the pool is busy reloading or
replacing). A request keeps the version it was routed to (held in the hot set) until its prediction
ends, even across a reload.

Failure mode: a failed group predict fails every request of that group with the same error; a
transport error (a ``DependencyUnavailable``: a worker lost, a connection refused) re-routes the
group up to ``route_retries`` times, nothing else does (``NotReady`` is the caller's to retry). An
error that is not ours is logged and becomes ``InferenceFailed``, as does a non-finite prediction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from examlops.core.errors import (
    DeadlineExceeded,
    DependencyUnavailable,
    ExamlopsError,
    InferenceFailed,
    InvalidInput,
    Refused,
)
from examlops.core.messages import InferenceRequest, InferenceResult
from examlops.registry.catalog import Catalog, ModelSpec
from examlops.serving.features import Features, validate_features
from examlops.serving.hotset import HotSet
from examlops.serving.metrics import PINNED_ALIAS
from examlops.serving.ports import PredictRuntime
from examlops.serving.residency import Entry
from examlops.serving.router import Router

log = logging.getLogger(__name__)


def _note_batch(members: Sequence[tuple[_Job, Entry]], predict_ms: float) -> None:
    """Note on each request's facts the predict call it joined: one batch id for the call, its size, its time.

    A group re-routed after a transport error is noted again by its next call: the last call is the one kept.
    """
    batch_id, size = "", len(members)
    for job, entry in members:
        facts = job.request.facts
        if facts is None:
            continue
        batch_id = batch_id or uuid.uuid4().hex[:16]
        facts.batch_id, facts.batch_size, facts.predict_ms = batch_id, size, predict_ms
        facts.alias, facts.version = job.alias, entry.ref.version


def check_deadline(req: InferenceRequest, now: float) -> None:
    """``DeadlineExceeded`` when ``req``'s deadline (UNIX time) is at or before ``now``."""
    if req.deadline is not None and now >= req.deadline:
        raise DeadlineExceeded("the caller's deadline passed before the prediction ran")


def _late() -> Refused:
    return Refused("the budget ran out before the prediction ran; it was not run", reason="late")


@dataclass(frozen=True, slots=True)
class Capacity:
    """Predict calls the runtime runs at once: ``workers`` for each model apart when ``per_model`` (Ray: a
    model's replicas serve it alone), else ``workers`` shared by every model (the predict pool)."""

    workers: int
    per_model: bool = False


def predict_capacity(runtime: PredictRuntime, workers: int) -> Capacity:
    """The runtime's ``model_capacity`` for each model when it has one (Ray), else ``workers`` shared."""
    per_model = getattr(runtime, "model_capacity", None)
    if isinstance(per_model, int) and per_model > 0:
        return Capacity(per_model, per_model=True)
    return Capacity(workers)


@dataclass(slots=True)
class Reply:
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


class Dispatcher:
    """Routes, groups and predicts the requests of one batch (contract above)."""

    def __init__(
        self,
        catalog: Catalog,
        router: Router,
        hotset: HotSet,
        runtime: PredictRuntime,
        *,
        route_retries: int,
        wall: Callable[[], float],
        on_predict: Callable[[str, int, float], None] | None = None,
        capacity: Capacity | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._catalog = catalog
        self._router = router
        self._hotset = hotset
        self._runtime = runtime
        self._route_retries = route_retries
        self._wall = wall
        self._clock = clock  # seconds, monotonic: how long a predict call took
        self._on_predict = on_predict
        # A predict call first takes a slot (a worker of the pool, or one of its model's replicas), THEN checks
        # its deadlines: time spent waiting for a worker counts, and an expired request never reaches one.
        self._capacity = capacity
        self._shared: asyncio.Semaphore | None = (
            asyncio.Semaphore(capacity.workers) if capacity is not None and not capacity.per_model else None
        )
        self._per_model: dict[str, asyncio.Semaphore] = {}

    def _slot(self, model: str) -> asyncio.Semaphore | contextlib.nullcontext[None]:
        if self._capacity is None:
            return contextlib.nullcontext()
        if not self._capacity.per_model:
            assert self._shared is not None
            return self._shared
        slot = self._per_model.get(model)
        if slot is None:
            slot = self._per_model[model] = asyncio.Semaphore(self._capacity.workers)
        return slot

    async def handle(self, batch: Sequence[InferenceRequest]) -> list[Reply]:
        specs = [self._catalog.get(req.model) for req in batch]
        replies: list[Reply | None] = [None] * len(batch)
        jobs: list[_Job] = []
        for i, checked in enumerate(validate_features(batch, specs)):
            if isinstance(checked, InvalidInput):
                replies[i] = Reply("", error=checked)  # not routed: infer keeps the requested alias
            else:
                jobs.append(_Job(i, batch[i], specs[i], checked))
        await self._router.refresh_stale({job.spec.name for job in jobs})
        for attempt in range(self._route_retries + 1):
            if not jobs:
                break
            jobs = await self._attempt(jobs, replies, last=attempt == self._route_retries)
        return [
            reply if reply is not None else Reply("other", error=InferenceFailed("no outcome")) for reply in replies
        ]

    async def _attempt(self, jobs: list[_Job], replies: list[Reply | None], *, last: bool) -> list[_Job]:
        """Route each job on its own, predict each group of one version once; returns the jobs to retry."""
        for job in jobs:
            req = job.request
            if req.version is not None:
                job.alias = PINNED_ALIAS
            elif req.routed and req.alias is not None:
                job.alias = req.alias
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
        self, key: str, members: list[tuple[_Job, Entry]], replies: list[Reply | None], *, last: bool
    ) -> list[_Job]:
        try:
            async with self._slot(members[0][0].spec.name):
                return await self._predict_live(key, members, replies, last=last)
        finally:
            for _, entry in members:
                self._hotset.release(entry)

    async def _predict_live(
        self, key: str, members: list[tuple[_Job, Entry]], replies: list[Reply | None], *, last: bool
    ) -> list[_Job]:
        """Predict the members whose deadline has not passed (checked once a worker slot is held)."""
        live: list[tuple[_Job, Entry]] = []
        now = self._wall()
        for job, entry in members:
            try:
                check_deadline(job.request, now)
                live.append((job, entry))
            except DeadlineExceeded:
                replies[job.index] = Reply(job.alias, error=_late())
        if not live:
            return []
        rows = np.stack([job.features.row for job, _ in live])
        began = self._clock()
        model = live[0][0].spec.name
        try:
            predictions = np.asarray(await self._runtime.predict(key, rows), dtype=np.float64).reshape(-1)
            if predictions.shape[0] != len(live):
                raise InferenceFailed(f"{key} returned {predictions.shape[0]} predictions for {len(live)} rows")
        except Exception as exc:
            self._observe(model, live, began)
            return self._settle([job for job, _ in live], exc, replies, last=last)
        self._observe(model, live, began)
        for (job, entry), value in zip(live, predictions, strict=True):
            replies[job.index] = self._result(job, entry, float(value))
        return []

    def _observe(self, model: str, live: list[tuple[_Job, Entry]], began: float) -> None:
        """Note the predict call on its requests' facts, and its time for the admission estimate (a failed
        or timed-out call too: a model that starts timing out must not keep its old, fast estimate)."""
        predict_ms = (self._clock() - began) * 1000.0
        _note_batch(live, predict_ms)
        if self._on_predict is not None:
            self._on_predict(model, len(live), predict_ms)

    @staticmethod
    def _result(job: _Job, entry: Entry, value: float) -> Reply:
        if not np.isfinite(value):
            return Reply(job.alias, error=InferenceFailed(f"{entry.key} returned no finite prediction"))
        ref = entry.ref
        result = InferenceResult(job.spec.name, job.alias, ref.version, ref.run_id, value, job.request.job_id)
        return Reply(job.alias, result=result)

    @staticmethod
    def _settle(jobs: list[_Job], exc: BaseException, replies: list[Reply | None], *, last: bool) -> list[_Job]:
        """Fail ``jobs`` with ``exc``, or hand them back for another route after a transport error."""
        if isinstance(exc, DependencyUnavailable) and not last:
            return jobs
        if not isinstance(exc, ExamlopsError):
            log.error("prediction failed unexpectedly", exc_info=exc)
            wrapped = InferenceFailed(f"the prediction failed ({type(exc).__name__})")
            wrapped.__cause__ = exc
            exc = wrapped
        for job in jobs:
            replies[job.index] = Reply(job.alias, error=exc)
        return []
