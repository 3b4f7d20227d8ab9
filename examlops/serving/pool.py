"""The predict pool: long-lived worker processes that run predictions under a hard limit.

Processes, not threads, because a prediction that times out in a thread keeps running and
keeps its thread, while a process can be killed (``bench/pool_timeout.py`` measures both).
Each worker (``pool_workers.Worker``: its process and pipe) answers through ``loop.add_reader``,
matched to futures by request id, so the event loop never blocks on a worker; which worker takes
what, and which one stands in for a lost one, is the roster's (``pool_roster``).

Contract (``PredictRuntime`` of ``examlops.serving.ports``):

- ``start()`` spawns ``workers`` processes plus one warm spare and returns once all answer. With ``preload``
  (module names), they fork from a warm fork server that imported those modules once (``core.children``),
  off the event loop, instead of each starting a fresh interpreter.
- ``load(key, location)``: every worker, the spare, and every worker started later runs
  ``loader(location)``, one worker at a time so that the others keep predicting.
  ``ModelLoadError`` naming the key and the cause when it raises in a worker (the first failure
  stops the round); the key is then unloaded everywhere. Loading the same location again is a no-op.
  Returns the input column count the model declares (``n_features_in_``) or None.
  A worker started later that cannot load a key logs it and answers ``VersionNotFound`` for it.
- ``predict(key, rows)`` goes to an idle worker; with none idle it waits, first come first
  served. It returns one finite float64 per row, in row order, or raises:

  - ``VersionNotFound`` when ``key`` is not loaded, ``InvalidInput`` when ``rows`` is not a
    non-empty 2-D array;
  - ``InferenceFailed`` when the model raised or returned an empty, wrongly sized or
    non-finite result; the worker keeps serving;
  - ``InferenceTimeout`` past ``timeout_s``: the worker is SIGKILLed, the warm spare takes its
    place at once (already loaded, so the next call does not wait for the stuck one), and a
    new spare starts in the background and loads every loaded key;
  - ``WorkerLost`` (retryable) when the worker died under the call (crash, OOM kill); it is
    replaced the same way;
  - ``PipelineUnavailable`` once the pool is closed or broken; ``NotReady`` before ``start``.

- ``close()`` stops every worker (idle ones by closing their pipe, busy ones by SIGKILL),
  waits for them all to be reaped, and fails every pending call with ``PipelineUnavailable``.
- No caller hangs: a dead worker fails what it held; when the pool's own machinery fails
  (a reply it cannot read, a worker it cannot spawn, workers dying as they start), the pool
  breaks: every worker is stopped and every pending call and waiter gets an error.
- Workers (and their fork server) ignore SIGINT and SIGTERM (the parent owns shutdown: a stop of serving's
  whole process group drains the calls in flight as a stop of serving alone does) and exit when the parent
  dies.
- Not thread-safe: call every method from the event loop that ran ``start()``. Spawning a worker
  blocks the loop briefly (its start-up happens in the child): only in ``start`` and on a replacement.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from examlops.core.children import CONTEXT, ChildContext, stop_warm_server, warm_context, warm_up
from examlops.core.errors import (
    ExamlopsError,
    InferenceTimeout,
    InvalidInput,
    ModelLoadError,
    NotReady,
    PipelineUnavailable,
    VersionNotFound,
    WorkerLost,
)
from examlops.serving.pool_roster import Roster
from examlops.serving.pool_workers import PoolStats, Worker, reap, watch
from examlops.serving.ports import ModelLoader, Rows

log = logging.getLogger(__name__)

MAX_START_FAILURES = 3
"""Workers in a row that die before answering once: then the pool breaks instead of respawning forever."""
REAP_TIMEOUT_S = 5.0


class ProcessPredictPool:
    """A ``PredictRuntime`` on worker processes; the module docstring states the contract."""

    def __init__(
        self, loader: ModelLoader, *, workers: int = 4, timeout_s: float = 30.0, preload: Sequence[str] = ()
    ) -> None:
        if workers < 1 or timeout_s <= 0:
            raise ValueError("workers must be at least 1 and timeout_s positive")
        self._loader, self._size, self._timeout_s = loader, workers, timeout_s
        self._preload = tuple(preload)
        self._context: ChildContext = CONTEXT
        self._roster = Roster()
        self._keys: dict[str, str] = {}
        self._loading: dict[str, str] = {}
        self._widths: dict[str, int | None] = {}
        self._ids = itertools.count(1)
        self._reaping: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: str | None = None
        self._closing = False
        """``close`` was called (the pool did not break on its own)."""
        self._replaced = self._in_flight = self._start_failures = 0

    async def start(self) -> None:
        if self._loop is not None:
            raise RuntimeError("the predict pool was already started")
        self._loop = asyncio.get_running_loop()
        try:
            if self._preload:
                self._context = warm_context(self._preload)
                await asyncio.to_thread(warm_up, self._context)  # the server's imports, off the loop
            while len(self._roster.active) < self._size:
                self._roster.active.append(self._spawn())
            self._roster.spare = self._spawn()
        except OSError as exc:
            await self.close()
            raise PipelineUnavailable(f"cannot start a predict worker: {exc}") from exc
        pings = [future for worker in self._roster.workers() for future in worker.pending.values()]
        failed = [r for r in await asyncio.gather(*pings, return_exceptions=True) if isinstance(r, BaseException)]
        if failed:
            await self.close()
            raise PipelineUnavailable(f"predict workers failed to start: {failed[0]}")

    async def load(self, key: str, location: str) -> int | None:
        self._check_open()
        if self._keys.get(key) == location:
            return self._widths.get(key)
        self._loading[key] = location  # workers spawned meanwhile load it too
        results: list[Any] = []
        try:
            # One worker at a time: a worker that loads cannot predict, so the others keep serving (a hot
            # reload under load would stall every prediction), and a bad version costs one worker's try.
            for worker in self._roster.workers():
                if worker.retired:
                    continue
                try:
                    results.append(await self._send(worker, "load", key, location))
                except ExamlopsError as exc:
                    results.append(exc)
                    if isinstance(exc, ModelLoadError):
                        break
        finally:
            self._loading.pop(key, None)
        self._check_open()
        failures = [r for r in results if isinstance(r, ModelLoadError)]
        # A worker lost meanwhile is fine: its replacement loads the key. All lost is not.
        if failures or all(isinstance(r, BaseException) for r in results):
            await self.unload(key)
            cause = failures[0].message if failures else "every worker died while loading it"
            raise ModelLoadError(f"cannot load model version {key!r} from {location!r}: {cause}")
        self._keys[key] = location
        self._widths[key] = width = next((r for r in results if isinstance(r, int)), None)
        return width

    async def unload(self, key: str) -> None:
        self._keys.pop(key, None)
        self._widths.pop(key, None)
        if self._loop is not None and self._stopped is None:
            for worker in self._roster.workers():
                watch(self._send(worker, "unload", key, None), f"unload {key!r}", self._closed)

    async def predict(self, key: str, rows: Rows) -> npt.NDArray[np.float64]:
        self._check_open()
        if key not in self._keys:
            raise VersionNotFound(f"model version {key!r} is not loaded in the predict pool")
        array = np.ascontiguousarray(rows, dtype=np.float64)
        if array.ndim != 2 or len(array) == 0:
            raise InvalidInput(f"rows must be a non-empty 2-D array, not one of shape {array.shape}")
        self._in_flight += 1
        try:
            worker = await self._roster.acquire()
            result: npt.NDArray[np.float64] = await self._send(worker, "predict", key, array, limit=True)
            return result
        finally:
            self._in_flight -= 1

    async def close(self) -> None:
        """Stop every worker and fail every pending call; safe to call twice."""
        if self._loop is None:
            return
        self._closing = True
        self._break("the predict pool is closed", graceful=True)
        await asyncio.gather(*self._reaping)
        if self._context is not CONTEXT:  # the warm fork server goes with its workers: nothing outlives serving
            await asyncio.to_thread(stop_warm_server, self._context)

    def stats(self) -> PoolStats:
        return PoolStats(len(self._roster.active), self._roster.busy(), self._replaced, self._in_flight)

    def _check_open(self) -> None:
        if self._stopped is not None:
            raise PipelineUnavailable(self._stopped)
        if self._loop is None:
            raise NotReady("the predict pool is not started")

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "start() sets the loop before any worker exists"
        return self._loop

    def _spawn(self) -> Worker:
        worker = Worker.spawn(self._loader, self._context)
        loop = self._running_loop()
        loop.add_reader(worker.conn.fileno(), self._guarded, self._on_reply, worker)
        loop.add_reader(worker.process.sentinel, self._guarded, self._retire, worker, "the predict worker exited")
        watch(self._send(worker, "ping", "", None), "start", self._closed)
        for key, location in {**self._keys, **self._loading}.items():
            watch(self._send(worker, "load", key, location), f"load {key!r}", self._closed)
        return worker

    def _send(self, worker: Worker, op: str, key: str, argument: Any, *, limit: bool = False) -> asyncio.Future[Any]:
        loop = self._running_loop()
        request_id = next(self._ids)
        future: asyncio.Future[Any] = loop.create_future()
        self._roster.taken(worker)
        try:
            worker.send(future, request_id, op, key, argument)
        except (OSError, ValueError):  # a broken pipe, or a worker retired already
            self._retire(worker, "the predict worker died")
        else:
            if limit:
                timer = loop.call_later(self._timeout_s, self._guarded, self._on_timeout, worker, request_id, key)
                worker.deadline = (request_id, timer)
        return future

    def _on_reply(self, worker: Worker) -> None:
        starting = not worker.started
        try:
            worker.answer()
        except (EOFError, OSError):
            self._retire(worker, "the predict worker died under the call")
            return
        if starting:
            self._start_failures = 0
        self._roster.release(worker)

    def _on_timeout(self, worker: Worker, request_id: int, key: str) -> None:
        limit = f"{self._timeout_s:g} s"
        worker.expire(request_id, InferenceTimeout(f"predicting with {key!r} ran past the {limit} limit"))
        self._retire(worker, f"the predict worker was killed after predicting with {key!r} timed out")

    def _retire(self, worker: Worker, reason: str, error: type[ExamlopsError] = WorkerLost, kill: bool = True) -> None:
        """Stop a worker, fail what it held and, unless the pool is stopping, put the spare in its place."""
        kill = kill or bool(worker.pending)
        worker.fail(error, reason)
        if worker.retired:
            return
        loop = self._running_loop()
        task = loop.create_task(reap(worker.shut(loop, kill=kill), REAP_TIMEOUT_S))
        self._reaping.add(task)
        task.add_done_callback(self._reaping.discard)
        if self._stopped is not None:
            return
        self._replaced += 1
        self._start_failures += not worker.started
        if self._start_failures >= MAX_START_FAILURES:
            self._break(f"{MAX_START_FAILURES} predict workers in a row died while starting")
            return
        try:
            self._roster.replace(worker, self._spawn)
        except (OSError, EOFError) as exc:  # EOFError: the fork server is gone (killed)
            log.warning("cannot start a predict worker: %r; the pool stops", exc)
            self._break(f"cannot start a predict worker: {exc!r}")

    def _closed(self) -> bool:
        return self._closing

    def _break(self, reason: str, *, graceful: bool = False) -> None:
        """Take no more calls: stop every worker and fail every waiter."""
        self._stopped = self._stopped or reason
        for worker in self._roster.clear():
            self._retire(worker, reason, PipelineUnavailable, kill=not graceful)
        self._roster.fail_waiters(lambda: PipelineUnavailable(reason))

    def _guarded(self, callback: Callable[..., None], *args: Any) -> None:
        """Run a loop callback; if the pool's own code fails, break the pool so that no caller hangs."""
        try:
            callback(*args)
        except Exception as exc:
            log.exception("the predict pool failed")
            self._break(f"the predict pool failed: {exc!r}")
