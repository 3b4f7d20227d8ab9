"""The task map's adapters: SQL behind the ``TaskMap`` port, seeded from the catalog, audited.

``task_map(settings)`` is the map for a CLI command with the audit hook its changes go to (its engine
closed on exit); ``seed_task_map`` is what
`exa up` and a starting serving process run: every catalog task not mapped yet, to its model's default
alias. The serving process's resolver is built in ``bootstrap.serving``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy.engine import Engine

from examlops.bootstrap.sql import sql_engine
from examlops.core.settings import Settings

if TYPE_CHECKING:
    from examlops.registry.catalog import Catalog
    from examlops.tasks.routes import TaskRoute
    from examlops.tasks.service import AuditHook
    from examlops.tasks.sql import SqlTaskMap


@dataclass(frozen=True)
class TaskMapAccess:
    map: SqlTaskMap
    audit: AuditHook
    """Appends a control event to the audit trail (Redis is reached on first use)."""


@contextmanager
def task_map(settings: Settings) -> Iterator[TaskMapAccess]:
    """The task map on the settings' SQL database and its audit hook; ``SchemaNotCurrent`` or
    ``StoreUnavailable`` when the database cannot be used."""
    from examlops.bootstrap.control import control_events
    from examlops.tasks.sql import SqlTaskMap

    engine = sql_engine(settings)
    try:
        yield TaskMapAccess(SqlTaskMap(engine), control_events(settings, engine))
    finally:
        engine.dispose()


def seed_task_map(engine: Engine, catalog: Catalog, audit: AuditHook | None = None) -> list[TaskRoute]:
    """Map every catalog task the map lacks; an operator's remap is never touched. The routes created."""
    from examlops.tasks.service import seed_tasks
    from examlops.tasks.sql import SqlTaskMap

    return seed_tasks(SqlTaskMap(engine), catalog, audit)
