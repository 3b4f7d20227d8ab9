"""One predict worker as the pool sees it: its process, its pipe, and the requests it holds; and
``PoolStats``, the pool's figures.

The pool (``pool.ProcessPredictPool``) decides which worker takes a call and what replaces a lost one;
a ``Worker`` only moves requests and replies:

- ``Worker.spawn(loader, context)`` starts the process (``core.children``, running ``pool_worker.serve``) in
  ``context`` (spawned, or forked from the pool's warm fork server); ``OSError`` when it cannot start.
- ``send(request_id, op, key, argument)`` registers a future for the request and writes it to the pipe;
  ``OSError`` or ``ValueError`` when the pipe is broken or closed (the future stays registered, so that
  ``fail`` settles it).
- ``answer()`` reads one reply and settles its future (``ok`` with the value, else the error its status
  names); ``EOFError`` or ``OSError`` when the worker is gone. It also stops the request's deadline timer.
- ``expire(request_id, error)`` fails one request (its deadline passed); ``fail(error, reason)`` fails
  every request it holds.
- ``shut(loop, kill=...)`` stops watching the worker on ``loop``, SIGKILLs it when asked, closes the pipe
  (an idle worker exits on EOF) and returns the process for ``reap``.
- ``reap(process, timeout_s)`` waits for it off the loop (SIGKILL after ``timeout_s``); ``watch(future,
  what)`` logs the failure of a request nobody awaits (start-up loads, unloads).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from examlops.core.children import CONTEXT, ChildContext, start_child, stop_child
from examlops.core.errors import (
    ExamlopsError,
    InferenceFailed,
    ModelLoadError,
    PipelineUnavailable,
    VersionNotFound,
)
from examlops.serving import pool_worker
from examlops.serving.ports import ModelLoader

log = logging.getLogger("examlops.serving.pool")

ERRORS: dict[str, type[ExamlopsError]] = {
    "failed": InferenceFailed,
    "missing": VersionNotFound,
    "load_error": ModelLoadError,
}
"""A worker's reply status -> the error it stands for."""


@dataclass(frozen=True, slots=True)
class PoolStats:
    workers: int
    """Worker processes that take predictions (the warm spare is not counted)."""
    busy: int
    """Of those, how many are running a request or still starting."""
    replaced: int
    """Workers killed after a timeout or found dead since start."""
    in_flight: int
    """predict() calls not answered yet, running or waiting for a worker."""


@dataclass(eq=False, slots=True)
class Worker:
    process: BaseProcess
    conn: Connection
    pending: dict[int, asyncio.Future[Any]] = field(default_factory=dict)
    deadline: tuple[int, asyncio.TimerHandle] | None = None
    started: bool = False
    """Whether it answered once (it finished starting)."""
    retired: bool = False

    @classmethod
    def spawn(cls, loader: ModelLoader, context: ChildContext = CONTEXT) -> Worker:
        parent_end, child_end = context.Pipe()
        try:
            args = (child_end, loader, os.getpid())
            process = start_child(pool_worker.serve, args, name="examlops-predict-worker", context=context)
        except BaseException:
            parent_end.close()
            raise
        finally:
            child_end.close()  # so that the worker's death reads as EOF here
        return cls(process, parent_end)

    def send(self, future: asyncio.Future[Any], request_id: int, op: str, key: str, argument: Any) -> None:
        self.pending[request_id] = future
        self.conn.send((request_id, op, key, argument))

    def answer(self) -> None:
        request_id, status, value = self.conn.recv()
        self.started = True
        if self.deadline is not None and self.deadline[0] == request_id:
            self.deadline[1].cancel()
            self.deadline = None
        future = self.pending.pop(request_id, None)
        if future is not None and not future.done():
            if status == "ok":
                future.set_result(value)
            else:
                future.set_exception(ERRORS[status](value))

    def expire(self, request_id: int, error: ExamlopsError) -> None:
        self.deadline = None
        future = self.pending.pop(request_id, None)
        if future is not None and not future.done():
            future.set_exception(error)

    def fail(self, error: type[ExamlopsError], reason: str) -> None:
        for future in self.pending.values():
            if not future.done():
                future.set_exception(error(reason))
        self.pending.clear()

    def shut(self, loop: asyncio.AbstractEventLoop, *, kill: bool) -> BaseProcess:
        self.retired = True
        loop.remove_reader(self.conn.fileno())
        loop.remove_reader(self.process.sentinel)
        if self.deadline is not None:
            self.deadline[1].cancel()
        if kill:
            self.process.kill()
        self.conn.close()
        return self.process


async def reap(process: BaseProcess, timeout_s: float) -> None:
    """Wait for a worker that was killed or whose pipe was closed (it exits on EOF); SIGKILL it after a while."""
    await asyncio.to_thread(stop_child, process, timeout_s, ask=False)


def watch(future: asyncio.Future[Any], what: str, closing: Callable[[], bool] = lambda: False) -> None:
    """Log the failure of a request nobody awaits (start-up loads, unloads), unless it is the
    ``PipelineUnavailable`` of a pool that ``closing()`` says was closed on purpose (the close dropped it)."""

    def report(done: asyncio.Future[Any]) -> None:
        if done.cancelled() or (exc := done.exception()) is None:
            return
        if not (isinstance(exc, PipelineUnavailable) and closing()):
            log.warning("a predict worker could not %s: %s", what, exc)

    future.add_done_callback(report)
