"""Loop records in SQL (SQLModel): the ``loop_state`` table and ``SqlLoopStore``, the ``LoopStore`` adapter.

One row per model (its catalog name). Holding a model is one ``UPDATE ... WHERE`` whose row count says
whether it happened, so two runs on two machines never both hold it; the first claim of a model inserts
its row, and a lost insert race is retried as an update. Times are UNIX seconds; the split, the figures
are JSON text. Database errors are ``StoreUnavailable``.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import case, or_, update
from sqlalchemy.engine import CursorResult, Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel, col, select

from examlops.db.session import store_session
from examlops.loop.state import ACTIVE_PHASES, LoopRecord, Phase

_ACTIVE = [phase.value for phase in ACTIVE_PHASES]
_JSON = ("restore", "figures")


class LoopState(SQLModel, table=True):
    __tablename__ = "loop_state"

    model: str = Field(primary_key=True)
    phase: str
    owner: str | None = None
    run: str = ""
    started_at: float = 0.0
    updated_at: float = 0.0
    canary_version: str | None = None
    production_version: str | None = None
    share: int = 0
    restore: str = "{}"
    figures: str = "{}"
    note: str = ""
    promoted_at: float | None = None
    replaced_version: str | None = None
    abort_requested: bool = False


def _record(row: LoopState) -> LoopRecord:
    values: dict[str, Any] = row.model_dump()
    values["phase"] = Phase(row.phase)
    for name in _JSON:
        values[name] = json.loads(values[name] or "{}")
    return LoopRecord(**values)


def _columns(values: dict[str, Any]) -> dict[str, Any]:
    columns = dict(values)
    for name in _JSON:
        if name in columns:
            columns[name] = json.dumps(columns[name], sort_keys=True, default=str)
    if isinstance(columns.get("phase"), Phase):
        columns["phase"] = columns["phase"].value
    unknown = set(columns) - set(LoopState.model_fields)
    if unknown:
        raise TypeError(f"no loop record field {sorted(unknown)}")
    return columns


class SqlLoopStore:
    """The loop records (contract: ``state.LoopStore``)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def _session(self, doing: str) -> AbstractContextManager[Session]:
        return store_session(self._engine, f"{doing} the closed loop's records")

    def get(self, model: str) -> LoopRecord | None:
        with self._session("read") as session:
            row = session.get(LoopState, model)
            return None if row is None else _record(row)

    def list(self) -> list[LoopRecord]:
        with self._session("read") as session:
            return [_record(row) for row in session.exec(select(LoopState).order_by(col(LoopState.model))).all()]

    def claim(
        self, model: str, owner: str, phase: Phase, now: float, lease_s: float, **values: Any
    ) -> LoopRecord | None:
        if not phase.active:
            raise ValueError(f"{phase} does not hold a model")
        columns = _columns({**values, "phase": phase, "owner": owner, "updated_at": now})
        free = or_(
            col(LoopState.phase).not_in(_ACTIVE),
            col(LoopState.owner) == owner,
            col(LoopState.updated_at) < now - lease_s,
        )
        with self._session("claim") as session:
            if session.get(LoopState, model) is None:
                try:
                    session.add(LoopState(model=model, **columns, abort_requested=False))
                    session.commit()
                    return self._reread(session, model)
                except IntegrityError:
                    session.rollback()  # another run inserted it first: compete on the update below
            # An abort asked of this owner survives its next claim (a retrain handing over to its analysis).
            kept = case((col(LoopState.owner) == owner, col(LoopState.abort_requested)), else_=False)
            claim = update(LoopState).where(col(LoopState.model) == model, free).values(**columns, abort_requested=kept)
            result = session.exec(claim)
            session.commit()
            return self._reread(session, model) if _count(result) == 1 else None

    def update(self, model: str, owner: str, now: float, **values: Any) -> LoopRecord | None:
        return self._owned_write(model, owner, _columns({**values, "updated_at": now}), "update")

    def finish(self, model: str, owner: str, phase: Phase, now: float, **values: Any) -> LoopRecord | None:
        if phase.active:
            raise ValueError(f"{phase} is not a final phase")
        columns = _columns({**values, "phase": phase, "owner": None, "updated_at": now, "abort_requested": False})
        return self._owned_write(model, owner, columns, "end")

    def request_abort(self, model: str, now: float) -> LoopRecord | None:
        with self._session("abort") as session:
            result = session.exec(
                update(LoopState)
                .where(col(LoopState.model) == model, col(LoopState.phase).in_(_ACTIVE))
                .values(abort_requested=True)
            )
            session.commit()
            return self._reread(session, model) if _count(result) == 1 else None

    def _owned_write(self, model: str, owner: str, columns: dict[str, Any], doing: str) -> LoopRecord | None:
        with self._session(doing) as session:
            result = session.exec(
                update(LoopState)
                .where(col(LoopState.model) == model, col(LoopState.owner) == owner, col(LoopState.phase).in_(_ACTIVE))
                .values(**columns)
            )
            session.commit()
            return self._reread(session, model) if _count(result) == 1 else None

    @staticmethod
    def _reread(session: Session, model: str) -> LoopRecord | None:
        row = session.get(LoopState, model, populate_existing=True)
        return None if row is None else _record(row)


def _count(result: Any) -> int:
    assert isinstance(result, CursorResult)
    return int(result.rowcount)
