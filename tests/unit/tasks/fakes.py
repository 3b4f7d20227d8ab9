"""A task map in memory, at the ``TaskMap`` port: it records reads and can be made unreachable."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime

from examlops.core.errors import StoreUnavailable
from examlops.tasks.routes import KEEP, Keep, TaskChange, TaskRoute, TaskSeed


class InMemoryTaskMap:
    def __init__(self) -> None:
        self.rows: dict[str, TaskRoute] = {}
        self.unavailable = False
        self.reads = 0

    def _check(self) -> None:
        if self.unavailable:
            raise StoreUnavailable("the task map's database is down")

    def get(self, task: str) -> TaskRoute | None:
        self._check()
        return self.rows.get(task.lower())

    def by_address(self, address: uuid.UUID) -> TaskRoute | None:
        self._check()
        return next((r for r in self.rows.values() if r.address == address), None)

    def routes(self) -> list[TaskRoute]:
        self.reads += 1
        self._check()
        return sorted(self.rows.values(), key=lambda r: r.task)

    def map(
        self, task: str, model: str, alias: str, adapter: str = "", budget_ms: float | Keep | None = KEEP
    ) -> TaskChange:
        self._check()
        key = task.lower()
        previous = self.rows.get(key)
        now = datetime.now(UTC)
        if previous is None:
            route = TaskRoute(key, model, alias, uuid.uuid4(), adapter, now)
        else:
            route = replace(previous, model=model, alias=alias, adapter=adapter, changed_at=now)
        if budget_ms is not KEEP:
            route = replace(route, budget_ms=budget_ms)
        self.rows[key] = route
        return TaskChange(route, previous)

    def add_missing(self, routes: Iterable[TaskSeed]) -> list[TaskRoute]:
        self._check()
        created = []
        for seed in routes:
            task, model, alias = seed[:3]
            if task.lower() not in self.rows:
                created.append(self.map(task, model, alias, budget_ms=seed[3] if len(seed) > 3 else None).route)
        return created
