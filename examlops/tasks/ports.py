"""The port of the task map: where tasks are mapped to models (SQL in production, ``sql.SqlTaskMap``).

Task names given to it are stored spellings (``routes.task_name``); model names are catalog spellings.
Every method raises ``StoreUnavailable`` when the store cannot be reached.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Protocol

from examlops.tasks.routes import KEEP, Keep, TaskChange, TaskRoute, TaskSeed


class TaskMap(Protocol):
    """Tasks -> (model, alias, adapter, bus address)."""

    def get(self, task: str) -> TaskRoute | None:
        """The task's route, or None when the task is not mapped."""
        ...

    def by_address(self, address: uuid.UUID) -> TaskRoute | None:
        """The route of the task whose bus address this is, or None."""
        ...

    def routes(self) -> list[TaskRoute]:
        """Every mapped task, sorted by name; each carries its bus address."""
        ...

    def map(
        self, task: str, model: str, alias: str, adapter: str = "", budget_ms: float | Keep | None = KEEP
    ) -> TaskChange:
        """Point the task at the model and alias, in one transaction. A new task gets a new address; a
        mapped one keeps its address. ``budget_ms`` sets the task's default budget (None clears it);
        ``KEEP`` leaves a mapped task's as it is (a new task then has none)."""
        ...

    def add_missing(self, routes: Iterable[TaskSeed]) -> list[TaskRoute]:
        """Map each ``(task, model, alias[, budget_ms])`` whose task is not mapped yet; a mapped task is left
        exactly as it is (an operator's remap is never overwritten). Returns the routes it created. Safe when
        several processes seed at once: a task another process created meanwhile counts as mapped."""
        ...
