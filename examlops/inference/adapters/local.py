"""The local adapter: in-process models from loaders, run off the event loop on a bounded thread pool.

Contract:

- Each route has a ``LocalTarget``: a loader (``examlops.inference.loaders``) returning an object with a
  synchronous ``predict_batch(instances)`` (input mappings in, one output mapping per instance out).
- Loading and every prediction run on one ``ThreadPoolExecutor`` of ``workers`` threads shared by the
  routes; the event loop never runs a model.
- ``warm_on_startup=True`` (the default): ``start()`` loads the model and a loader error fails start-up
  closed (PRECONDITION ``inference_model_load_failed``, chained; the pool is shut). Otherwise the first
  call loads it; a failed load is not remembered, the next call tries again; a load outlives a caller
  that gave up on it, so the next caller finds it done or waits for the same load.
- Deadline: a call gives up by ``call.deadline`` (TIMEOUT ``inference_timeout``) and is cancellable. A
  call still queued for a worker is dropped from the queue and never runs. A prediction already running
  cannot be stopped, since a thread cannot be killed: it runs to its end on its worker, its result is
  discarded, and until then that worker is busy (a pool of N with N stuck predictions queues every other
  call until one ends). When a hard stop matters, serve the model from examlops' process pool
  (``examlops/serving/pool.py``) and call it through a remote adapter.
- ``serialize_calls=True``: one call at a time per route, for models that are not thread-safe. Callers
  queue on the event loop (not on workers); a timed-out prediction still running keeps the route's
  thread lock, so the next one waits on its worker until the stale one ends: never two at once. A call
  that timed out or was cancelled while its worker waited for that lock (or for a worker) does not run
  the model once it gets there: its worker returns at once, so dead calls never pile up behind a slow one.
- A model that raises, or returns something that is not a sequence, is MODEL_FAILURE
  ``inference_model_failed``; the port's shaping judges the outputs' count and shape.
- ``close()`` cancels queued work and releases the pool without waiting for running predictions (the
  interpreter still joins the pool's threads at exit, so a stuck prediction delays exit until it ends).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from examlops.inference.errors import InferenceError, Kind, route_unknown
from examlops.inference.loaders import BatchPredictor, Loader
from examlops.inference.ports import Call, Capabilities, Row

DEFAULT_WORKERS = 4


@dataclass(frozen=True, slots=True)
class LocalTarget:
    """One route's in-process model."""

    adapter: ClassVar[str] = "local"
    loader: Loader
    warm_on_startup: bool = True
    serialize_calls: bool = False


class LocalInferenceAdapter:
    """See the module docstring."""

    backend = "local"

    def __init__(self, targets: Mapping[str, LocalTarget], *, workers: int = DEFAULT_WORKERS) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.capabilities = Capabilities(native_batching=True, streaming=True)
        self._targets = dict(targets)
        self._workers = workers
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._models: dict[str, BatchPredictor] = {}
        self._loading: dict[str, asyncio.Future[BatchPredictor]] = {}
        self._serialized = [route for route, target in self._targets.items() if target.serialize_calls]
        self._call_locks: dict[str, asyncio.Lock] = {}  # made in start(), on the loop that uses them
        self._thread_locks = {route: threading.Lock() for route in self._serialized}

    async def start(self) -> None:
        if self._executor is not None:
            return
        self._executor = concurrent.futures.ThreadPoolExecutor(self._workers, thread_name_prefix="examlops-inference")
        self._call_locks = {route: asyncio.Lock() for route in self._serialized}
        try:
            for route, target in self._targets.items():
                if target.warm_on_startup:
                    await self._model(route)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        executor, self._executor = self._executor, None
        self._models.clear()
        for pending in self._loading.values():
            pending.cancel()
        self._loading.clear()
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    def _pool(self, route: str) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            raise InferenceError(
                Kind.PRECONDITION,
                "the local adapter is not started (or is closed)",
                code="inference_not_started",
                backend=self.backend,
                route=route,
            )
        return self._executor

    async def _model(self, route: str) -> BatchPredictor:
        """The route's loaded model, loading it once (shared by every caller waiting for it)."""
        if route in self._models:
            return self._models[route]
        target = self._targets.get(route)
        if target is None:
            raise route_unknown(route, backend=self.backend)
        pending = self._loading.get(route)
        if pending is None:
            pending = asyncio.wrap_future(self._pool(route).submit(self._load, route, target))
            self._loading[route] = pending
            pending.add_done_callback(lambda done: self._loaded(route, done))
        return await asyncio.shield(pending)

    def _loaded(self, route: str, done: asyncio.Future[BatchPredictor]) -> None:
        if self._loading.get(route) is done:
            del self._loading[route]
        if not done.cancelled() and done.exception() is None:
            self._models[route] = done.result()

    def _load(self, route: str, target: LocalTarget) -> BatchPredictor:
        try:
            model = target.loader()
        except Exception as exc:
            raise InferenceError(
                Kind.PRECONDITION,
                f"loading the model failed: {type(exc).__name__}",
                code="inference_model_load_failed",
                backend=self.backend,
                route=route,
            ) from exc
        if not callable(getattr(model, "predict_batch", None)):
            raise InferenceError(
                Kind.PRECONDITION,
                f"the loader returned a {type(model).__name__}, which has no predict_batch",
                code="inference_model_load_failed",
                backend=self.backend,
                route=route,
            )
        return model

    def _run(
        self, route: str, model: BatchPredictor, rows: Sequence[Row], call: Call, gave_up: threading.Event
    ) -> list[Row]:
        lock = self._thread_locks.get(route)
        try:
            with lock if lock is not None else contextlib.nullcontext():
                if gave_up.is_set() or call.remaining_s() == 0:
                    return []  # nobody waits for it any more: do not run (and hold the route for) a dead call
                outputs = model.predict_batch(rows)
            if isinstance(outputs, (str, bytes, Mapping)) or not isinstance(outputs, Sequence):
                raise TypeError(f"predict_batch returned a {type(outputs).__name__}, not a sequence")
            return list(outputs)
        except Exception as exc:
            raise InferenceError(
                Kind.MODEL_FAILURE,
                f"the model failed: {type(exc).__name__}",
                code="inference_model_failed",
                backend=self.backend,
                route=route,
            ) from exc

    async def predict_batch(self, route: str, rows: Sequence[Row], call: Call) -> Sequence[Row]:
        gave_up = threading.Event()  # set when this call times out or is cancelled: its worker then skips the model
        try:
            async with asyncio.timeout(call.remaining_s()):
                model = await self._model(route)
                lock = self._call_locks.get(route)
                async with lock if lock is not None else contextlib.nullcontext():
                    # Cancelling the wrapped future cancels the job while it is still queued.
                    job = self._pool(route).submit(self._run, route, model, rows, call, gave_up)
                    try:
                        return await asyncio.wrap_future(job)
                    except BaseException:
                        gave_up.set()
                        raise
        except TimeoutError:
            raise InferenceError(
                Kind.TIMEOUT,
                "the deadline passed before the model answered",
                code="inference_timeout",
                backend=self.backend,
                route=route,
            ) from None

    async def stream_batches(self, route: str, rows: Sequence[Row], call: Call) -> AsyncIterator[Sequence[Row]]:
        size = int(call.options.get("chunk_size") or len(rows) or 1)
        for start in range(0, len(rows), size):
            yield await self.predict_batch(route, rows[start : start + size], call)


def local_adapter(targets: Mapping[str, Any], settings: Mapping[str, Any]) -> LocalInferenceAdapter:
    """The wiring's factory: ``LocalTarget``s from Python, or mappings from YAML (``local_config``)."""
    from examlops.inference.adapters.local_config import local_target

    built = {route: t if isinstance(t, LocalTarget) else local_target(route, t) for route, t in targets.items()}
    return LocalInferenceAdapter(built, workers=int(settings.get("workers", DEFAULT_WORKERS)))
