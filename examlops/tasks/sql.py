"""The task map in SQL (SQLModel): the adapter behind the ``TaskMap`` port.

One row per task, the task name its key (stored lower-cased). The bus address is a random UUID written
with the task's first row and never rewritten: a remap changes model, alias, adapter and default budget
(``budget_ms``, migration ``0005``; NULL: calls without a budget get no limit) only. What the map
was and who changed it is on the audit trail (``task.mapped`` events), not in this table.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from contextlib import AbstractContextManager
from datetime import UTC, datetime

from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel, select

from examlops.core.errors import Conflict
from examlops.db.session import store_session
from examlops.tasks.routes import KEEP, Keep, TaskChange, TaskRoute, TaskSeed


class TaskMapping(SQLModel, table=True):
    task: str = Field(primary_key=True)
    model: str
    alias: str
    adapter: str = ""
    address: str = Field(unique=True)
    """The task's bus address, a UUID in its canonical text form."""
    changed_at: datetime
    budget_ms: float | None = None
    """The task's default budget in milliseconds (NULL: none)."""


def _route(row: TaskMapping) -> TaskRoute:
    changed = row.changed_at if row.changed_at.tzinfo is not None else row.changed_at.replace(tzinfo=UTC)
    return TaskRoute(
        task=row.task,
        model=row.model,
        alias=row.alias,
        address=uuid.UUID(row.address),
        adapter=row.adapter,
        changed_at=changed,
        budget_ms=row.budget_ms,
    )


class SqlTaskMap:
    """Reads and changes the task map; ``StoreUnavailable`` when the database cannot be reached."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def _session(self, doing: str) -> AbstractContextManager[Session]:
        return store_session(self._engine, f"{doing} the task map")

    def get(self, task: str) -> TaskRoute | None:
        with self._session("read") as session:
            row = session.get(TaskMapping, task.lower())
            return None if row is None else _route(row)

    def by_address(self, address: uuid.UUID) -> TaskRoute | None:
        with self._session("read") as session:
            row = session.exec(select(TaskMapping).where(TaskMapping.address == str(address))).first()
            return None if row is None else _route(row)

    def routes(self) -> list[TaskRoute]:
        with self._session("read") as session:
            rows = session.exec(select(TaskMapping).order_by(TaskMapping.task)).all()
            return [_route(row) for row in rows]

    def map(
        self, task: str, model: str, alias: str, adapter: str = "", budget_ms: float | Keep | None = KEEP
    ) -> TaskChange:
        key = task.lower()
        with self._session("change") as session:
            row = session.get(TaskMapping, key, with_for_update=True)
            previous = None if row is None else _route(row)
            if row is None:
                row = TaskMapping(task=key, model=model, alias=alias, address=str(uuid.uuid4()), changed_at=_now())
            row.model, row.alias, row.adapter, row.changed_at = model, alias, adapter, _now()
            if budget_ms is not KEEP:
                row.budget_ms = budget_ms
            session.add(row)
            try:
                session.commit()
            except IntegrityError as exc:  # another process created the same new task at the same moment
                raise Conflict(f"task {key!r} was mapped by someone else meanwhile: look again and retry") from exc
            session.refresh(row)
            return TaskChange(_route(row), previous)

    def add_missing(self, routes: Iterable[TaskSeed]) -> list[TaskRoute]:
        created: list[TaskRoute] = []
        for seed in routes:
            task, model, alias = seed[:3]
            budget_ms = seed[3] if len(seed) > 3 else None
            key = task.lower()
            with self._session("seed") as session:
                if session.get(TaskMapping, key) is not None:
                    continue
                row = TaskMapping(
                    task=key,
                    model=model,
                    alias=alias,
                    address=str(uuid.uuid4()),
                    changed_at=_now(),
                    budget_ms=budget_ms,
                )
                session.add(row)
                try:
                    session.commit()
                except IntegrityError:  # another process seeded it between our read and our write
                    session.rollback()
                    continue
                session.refresh(row)
                created.append(_route(row))
        return created


def _now() -> datetime:
    return datetime.now(UTC)
