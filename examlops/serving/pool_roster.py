"""Which predict worker takes the next call: the pool's active workers, its warm spare, the idle ones and the
callers waiting for one (``pool.ProcessPredictPool`` owns the processes; this module only assigns them).

Contract:

- ``acquire()`` returns an idle active worker, or waits for one: waiting callers are served first come,
  first served. A caller cancelled just as a worker was handed to it gives the worker back.
- ``release(worker)`` makes a worker with nothing pending available again: to the longest-waiting caller,
  else to the idle queue. A retired worker, the spare, or one already idle is left alone.
- ``taken(worker)``: the worker was just given a call (a ping, a load) outside ``acquire``; it is no longer idle.
- ``replace(worker, spawn)`` takes a lost worker off the roster: an active one is replaced by the warm
  spare (or a new worker when there is none), which is released at once; a new spare is then spawned.
  ``spawn`` raising ``OSError`` propagates, with the roster consistent.
- ``clear()`` empties the roster and returns every worker it held; ``fail_waiters(error)`` fails every
  waiting caller with an error of its own, ``error()`` (the pool breaking or closing).

Not thread-safe: the pool calls it from its event loop only.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

from examlops.serving.pool_workers import Worker


class Roster:
    """The pool's workers and the calls waiting for one (contract above)."""

    def __init__(self) -> None:
        self.active: list[Worker] = []
        self.spare: Worker | None = None
        self._idle: collections.deque[Worker] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[Worker]] = collections.deque()

    def workers(self) -> list[Worker]:
        """Every worker held: the active ones, then the spare."""
        return [*self.active, *([self.spare] if self.spare else [])]

    def busy(self) -> int:
        return sum(1 for worker in self.active if worker.pending)

    async def acquire(self) -> Worker:
        if self._idle:
            return self._idle.popleft()
        waiter: asyncio.Future[Worker] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release(waiter.result())  # handed over just as the caller gave up
            raise

    def release(self, worker: Worker) -> None:
        if worker.pending or worker.retired or worker not in self.active or worker in self._idle:
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(worker)
                return
        self._idle.append(worker)

    def taken(self, worker: Worker) -> None:
        if worker in self._idle:
            self._idle.remove(worker)

    def replace(self, worker: Worker, spawn: Callable[[], Worker]) -> None:
        if worker in self.active:
            self.active.remove(worker)
            promoted, self.spare = self.spare or spawn(), None
            self.active.append(promoted)
            self.release(promoted)
        elif worker is self.spare:
            self.spare = None
        if self.spare is None:
            self.spare = spawn()

    def clear(self) -> list[Worker]:
        workers, self.active, self.spare = self.workers(), [], None
        self._idle.clear()
        return workers

    def fail_waiters(self, error: Callable[[], Exception]) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error())
