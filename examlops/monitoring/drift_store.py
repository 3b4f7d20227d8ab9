"""Drift status rows in SQL (SQLModel): one row per model, kind (prediction or input) and reported window.

``exa drift status`` and ``exa drift input status`` read the latest row of
each model (``latest``); the dashboard's drift charts read ``history``. Rows
are only added, never updated: the table is the history of every report.
``(model, kind, last_id)`` is unique, so a window saved twice (a run that
crashed between saving and advancing its checkpoint, then ran again) keeps its
first row. Database errors become ``StoreUnavailable``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import UniqueConstraint, func
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlmodel import Field, Session, SQLModel, col, select

from examlops.core.errors import StoreUnavailable

if TYPE_CHECKING:
    from examlops.monitoring.drift import DriftResult
    from examlops.monitoring.drift_report import DriftReport


class DriftStatus(SQLModel, table=True):
    __table_args__ = (UniqueConstraint("model", "kind", "last_id"),)

    id: int | None = Field(default=None, primary_key=True)
    model: str = Field(index=True)
    kind: str
    """prediction or input."""
    version: str
    drifted: bool
    score: float
    method: str
    threshold: float
    columns: str
    """JSON: [{column, score, drifted}]."""
    reference: str
    reference_rows: int
    current_rows: int
    first_id: str
    last_id: str
    window_start: datetime
    window_end: datetime
    report_html: str
    report_json: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class StatusRow:
    """A row as read back, detached from any session."""

    model: str
    kind: str
    version: str
    drifted: bool
    score: float
    method: str
    threshold: float
    columns: list[dict[str, object]]
    reference: str
    reference_rows: int
    current_rows: int
    window_start: datetime
    window_end: datetime
    report_html: str
    report_json: str
    created_at: datetime


def _row(report: DriftReport, result: DriftResult) -> DriftStatus:
    w = report.window
    return DriftStatus(
        model=report.model, kind=result.kind, version=report.version, drifted=result.drifted, score=result.score,
        method=result.method, threshold=result.threshold,
        columns=json.dumps([{"column": c.column, "score": c.score, "drifted": c.drifted} for c in result.columns]),
        reference=report.reference, reference_rows=result.reference_rows, current_rows=result.current_rows,
        first_id=w.first_id, last_id=w.last_id, window_start=w.start, window_end=w.end,
        report_html=str(report.html_path), report_json=str(report.json_path), created_at=report.created_at,
    )  # fmt: skip


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)  # SQLite hands datetimes back naive


class SqlDriftStore:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def save(self, report: DriftReport) -> None:
        """Add the prediction and input rows of one report; a window already saved is left as it is."""
        try:
            with Session(self._engine) as session:
                session.add(_row(report, report.prediction))
                session.add(_row(report, report.input))
                session.commit()
        except IntegrityError:
            return
        except OperationalError as exc:
            raise StoreUnavailable(f"the drift status table cannot be written: {exc}") from exc

    def latest(self, kind: str = "prediction", model: str | None = None) -> list[StatusRow]:
        """The newest row of ``kind`` per model (or of one model, any case), sorted by model."""
        newest = select(DriftStatus.model, func.max(DriftStatus.id).label("id")).where(DriftStatus.kind == kind)
        if model is not None:
            newest = newest.where(func.lower(DriftStatus.model) == model.lower())
        ids = newest.group_by(DriftStatus.model).subquery()
        query = select(DriftStatus).join(ids, col(DriftStatus.id) == ids.c.id).order_by(DriftStatus.model)
        try:
            with Session(self._engine) as session:
                rows = session.exec(query).all()
        except OperationalError as exc:
            raise StoreUnavailable(f"the drift status table cannot be read: {exc}") from exc
        return [_status(r) for r in rows]

    def history(self, limit: int = 500, model: str | None = None) -> list[StatusRow]:
        """The newest ``limit`` rows of every model (or of ``model``) and kind, oldest first (the dashboard's
        drift charts, one model each)."""
        query = select(DriftStatus).order_by(col(DriftStatus.id).desc()).limit(limit)
        if model is not None:
            query = query.where(DriftStatus.model == model)
        try:
            with Session(self._engine) as session:
                rows = session.exec(query).all()
        except OperationalError as exc:
            raise StoreUnavailable(f"the drift status table cannot be read: {exc}") from exc
        return [_status(r) for r in reversed(rows)]


def _status(r: DriftStatus) -> StatusRow:
    return StatusRow(
        r.model, r.kind, r.version, r.drifted, r.score, r.method, r.threshold, json.loads(r.columns),
        r.reference, r.reference_rows, r.current_rows, _utc(r.window_start), _utc(r.window_end),
        r.report_html, r.report_json, _utc(r.created_at),
    )  # fmt: skip
