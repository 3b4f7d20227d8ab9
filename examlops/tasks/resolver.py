"""The task resolver: which model and alias answer a task now, from a cached copy of the whole task map.

Contract:

- ``resolve(task)`` answers from a snapshot of the whole map that is at most ``ttl_s`` seconds old (the
  same ``settings.traffic.rules_ttl_s`` that traffic splits live by). A stale snapshot is read again off
  the event loop, once however many calls wait for it; calls that started before a remap keep the route
  they resolved, so a remap never fails a call in flight, and every call that starts ``ttl_s`` after it
  gets the new route, with no restart.
- The whole map is cached rather than task by task: it is small, one read serves every task, and a name
  that is not mapped costs no read and no cache entry (a caller spraying made-up names cannot grow it).
- An unknown task, or a name that cannot be a task, is ``TaskNotFound`` naming at most a short prefix.
- When the store cannot be read, the last snapshot keeps answering and the store is asked again after
  ``ttl_s``: resolution never fails because SQL is down once the map was read. Before the first read
  succeeds, ``StoreUnavailable`` passes through.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from examlops.core.errors import InvalidInput, TaskNotFound
from examlops.tasks.ports import TaskMap
from examlops.tasks.routes import TaskRoute, short, task_name

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Snapshot:
    expires: float
    by_task: Mapping[str, TaskRoute]
    by_address: Mapping[uuid.UUID, TaskRoute]


class TaskResolver:
    """Resolves tasks and task addresses from a snapshot of the task map (contract above)."""

    def __init__(self, task_map: TaskMap, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._map = task_map
        self._ttl_s = ttl_s
        self._clock = clock
        self._snapshot: _Snapshot | None = None
        self._reading: asyncio.Task[_Snapshot] | None = None

    async def resolve(self, task: str) -> TaskRoute:
        """The route that answers ``task`` now; ``TaskNotFound`` when the task is not mapped."""
        try:
            key = task_name(task)
        except InvalidInput:
            key = None
        route = None if key is None else (await self._fresh()).by_task.get(key)
        if route is None:
            raise TaskNotFound(f"task {short(task)!r} is not mapped (`exa task list` shows the map)", field="task")
        return route

    async def by_address(self, address: uuid.UUID) -> TaskRoute | None:
        """The route of the task whose bus address this is, from the same snapshot; None when none has it."""
        return (await self._fresh()).by_address.get(address)

    async def routes(self) -> list[TaskRoute]:
        """Every mapped task, from the same snapshot, sorted by name."""
        return sorted((await self._fresh()).by_task.values(), key=lambda route: route.task)

    def invalidate(self) -> None:
        """Forget the snapshot in this process: the next call reads the map again."""
        self._snapshot = None

    async def _fresh(self) -> _Snapshot:
        snapshot = self._snapshot
        if snapshot is not None and snapshot.expires > self._clock():
            return snapshot
        if self._reading is None:
            self._reading = asyncio.get_running_loop().create_task(asyncio.to_thread(self._read))
            self._reading.add_done_callback(self._read_done)
        # shield: a cancelled caller must not cancel a read that other calls share.
        return await asyncio.shield(self._reading)

    def _read_done(self, task: asyncio.Task[_Snapshot]) -> None:
        if self._reading is task:
            self._reading = None
        if not task.cancelled():
            task.exception()  # retrieved here so that a failed read nobody awaited is not reported as lost

    def _read(self) -> _Snapshot:
        """Read the whole map now (blocking) and keep it for ``ttl_s``; on failure keep the last snapshot
        for another ``ttl_s``, or raise ``StoreUnavailable`` when there is none."""
        try:
            routes = self._map.routes()
        except Exception as exc:
            previous = self._snapshot
            if previous is None:
                raise
            log.warning("task map unreadable, keeping the last one read: %r", exc)
            snapshot = _Snapshot(self._clock() + self._ttl_s, previous.by_task, previous.by_address)
        else:
            snapshot = _Snapshot(
                self._clock() + self._ttl_s,
                {route.task: route for route in routes},
                {route.address: route for route in routes},
            )
        self._snapshot = snapshot
        return snapshot
