"""Traces in SQL (SQLModel): the ``Trace`` table and ``SqlTraceStore``, the ``TraceStore`` adapter.

One row per call, keyed by its trace id; indexed on time, identity, task, model and outcome (the filters of
`exa trace list` and ``GET /v1/traces``): outcome only where it is not ``answered``, task only where set
(revision ``0009``). ``add`` writes a batch in one transaction; a trace id already stored stays one row (``ON
CONFLICT`` on SQLite and Postgres): the first record's fields are kept and only fields it left empty (batch,
queue wait, predict time, alias, version) are filled from the later one, except that a verdict
(``TraceRecord.verdict``) sets outcome, error code and status. Database errors become ``StoreUnavailable``.

On SQLite and Postgres a batch is one ``INSERT .. ON CONFLICT DO UPDATE`` compiled once per engine and run by
the driver's ``executemany`` on tuples (``Connection.exec_driver_sql``), with each column's bind processor
taken from SQLAlchemy's types: the same statement and values as ``Connection.execute`` with one dict per
row, without SQLAlchemy's per-row parameter processing (bench/RESULTS.md). On SQLite a batch is first an
``INSERT .. ON CONFLICT DO NOTHING`` (the driver's row count is how many ids were new) and the upsert runs
only when some id was stored already; ``at`` goes as the text SQLAlchemy's SQLite type stores, made in one
call. Postgres reads the stored ids first (one statement).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from sqlalchemy import Index, bindparam, delete, func, text, update
from sqlalchemy import select as sa_select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import InterfaceError, OperationalError, ProgrammingError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlmodel import Field, Session, SQLModel, col, select
from sqlmodel.sql.expression import SelectOfScalar

from examlops.core.errors import StoreUnavailable
from examlops.tracing.record import Channel, Outcome, TraceRecord, trace_fields
from examlops.tracing.sql_driver import DriverStatement
from examlops.tracing.store import MAX_PAGE, CallOutcome, Pruned, TraceQuery

S = TypeVar("S")


_NOT_ANSWERED = "outcome <> 'answered'"
_TASK_SET = "task IS NOT NULL"
"""The partial indexes' conditions (revision ``0009``): a row is indexed by outcome when it was not answered
and by task when it has one; the answered and task-less majority costs the writer two index entries less."""


class Trace(SQLModel, table=True):
    __table_args__ = (
        Index("ix_trace_at", "at"),
        Index("ix_trace_identity", "identity"),
        Index("ix_trace_task", "task", sqlite_where=text(_TASK_SET), postgresql_where=text(_TASK_SET)),
        Index("ix_trace_model", "model"),
        Index("ix_trace_outcome", "outcome", sqlite_where=text(_NOT_ANSWERED), postgresql_where=text(_NOT_ANSWERED)),
    )

    trace_id: str = Field(primary_key=True, max_length=32)
    at: datetime
    channel: str
    outcome: str
    error_code: str
    model: str | None = None
    alias: str | None = None
    version: str | None = None
    adapter: str | None = None
    identity: str | None = None
    task: str | None = None
    budget_ms: float | None = None
    budget_remaining_ms: float | None = None
    used_ms: float
    node: str
    batch_id: str | None = None
    batch_size: int | None = None
    queue_wait_ms: float | None = None
    predict_ms: float | None = None
    status: int
    job_id: str | None = None
    input: str
    output: str


_UNAVAILABLE = (OperationalError, ProgrammingError, InterfaceError, PoolTimeout)
"""The database down, unreachable, out of connections or without the table: ``StoreUnavailable``, which the
sink waits out. Any other error (a value the database refuses, say) is the records' own."""

_FILLED = ("alias", "version", "batch_id", "batch_size", "queue_wait_ms", "predict_ms")
"""Fields a later record of a call fills when the stored one left them empty (serving knows them, its bridge
does not)."""
_VERDICT = ("outcome", "error_code", "status")
"""Fields a verdict sets: what the caller got."""
_KNOWN = sa_select(Trace.__table__.c.trace_id).where(  # type: ignore[attr-defined]  # SQLModel's table
    Trace.__table__.c.trace_id.in_(bindparam("ids", expanding=True))  # type: ignore[attr-defined]
)
"""The stored ids among a batch's: one statement, its ids one expanding parameter (not a literal each, which
SQLAlchemy would coerce one by one on every batch: bench/RESULTS.md)."""


def _row(record: TraceRecord) -> dict[str, Any]:
    values = trace_fields(record)
    values["at"] = datetime.fromtimestamp(record.at, UTC)
    return values


def _timestamp(at: datetime) -> float:
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()  # SQLite hands datetimes back naive


def _record(row: Trace) -> TraceRecord:
    values = row.model_dump()
    values["at"] = _timestamp(row.at)
    values["channel"] = cast(Channel, row.channel)
    values["outcome"] = cast(Outcome, row.outcome)
    return TraceRecord(**values)


class SqlTraceStore:
    """``TraceStore`` on an engine whose schema is current (``bootstrap.sql_engine``)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._upserts: dict[bool | None, DriverStatement] = {}
        """The compiled upserts (by ``verdict``) and, under None, SQLite's insert of new ids."""

    def add(self, records: Sequence[TraceRecord]) -> int:
        if not records:
            return 0
        last: dict[str, TraceRecord] = {}
        for record in records:  # one row per id in a statement (Postgres refuses to update a row twice)
            kept = last.get(record.trace_id)
            last[record.trace_id] = record if kept is None or (record.verdict and not kept.verdict) else kept
        ids = list(last)
        try:
            with self._engine.begin() as connection:
                if self._engine.dialect.name == "sqlite":
                    return sum(self._insert_new(connection, group, verdict) for verdict, group in _groups(last))
                known = set(connection.execute(_KNOWN, {"ids": ids}).scalars())
                for verdict, group in _groups(last):
                    self._upsert(connection, group, known, verdict=verdict)
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"the trace table cannot be written: {exc}") from exc
        return len(ids) - len(known)

    def _insert_new(self, connection: Connection, records: list[TraceRecord], verdict: bool) -> int:
        """SQLite: the new ids of ``records`` inserted, how many they were; when some id was stored already,
        ``records`` again as the upsert (a row just inserted is upserted to itself: unchanged)."""
        insert, upsert = self._driver_insert(), self._driver_upsert(verdict)
        assert insert is not None and upsert is not None  # SQLite has both
        rows = insert.parameters(records)
        added = connection.exec_driver_sql(insert.sql, rows).rowcount
        if added != len(records):
            connection.exec_driver_sql(upsert.sql, rows if upsert.binds == insert.binds else upsert.parameters(records))
        return int(added)

    def _upsert(self, connection: Connection, records: list[TraceRecord], known: set[str], *, verdict: bool) -> None:
        upsert = self._driver_upsert(verdict)
        if upsert is not None:
            connection.exec_driver_sql(upsert.sql, upsert.parameters(records))
            return
        rows = [_row(r) for r in records]
        fresh = [row for row in rows if row["trace_id"] not in known]
        if fresh:
            connection.execute(Trace.__table__.insert(), fresh)  # type: ignore[attr-defined]  # SQLModel's table
        if verdict:
            for row in rows:
                if row["trace_id"] in known:
                    changes = {name: row[name] for name in _VERDICT}
                    connection.execute(update(Trace).where(col(Trace.trace_id) == row["trace_id"]).values(**changes))

    def _driver_insert(self) -> DriverStatement | None:
        """SQLite's ``INSERT .. ON CONFLICT DO NOTHING`` of a batch, compiled once (None elsewhere)."""
        insert = self._upserts.get(None)
        if insert is None and self._engine.dialect.name == "sqlite":
            statement = sqlite.insert(Trace).on_conflict_do_nothing(index_elements=["trace_id"])
            insert = self._upserts[None] = DriverStatement.compile(statement, self._engine.dialect, Trace.__table__)  # type: ignore[attr-defined]  # SQLModel's table
        return insert

    def _driver_upsert(self, verdict: bool) -> DriverStatement | None:
        """The compiled upsert on SQLite and Postgres (None on another database)."""
        upsert = self._upserts.get(verdict)
        if upsert is None:
            dialect = self._engine.dialect
            if dialect.name not in ("sqlite", "postgresql"):
                return None
            module: Any = sqlite if dialect.name == "sqlite" else postgresql
            statement = module.insert(Trace)
            table, new = Trace.__table__.c, statement.excluded  # type: ignore[attr-defined]  # SQLModel's table
            changes = {name: func.coalesce(table[name], new[name]) for name in _FILLED}
            if verdict:
                changes |= {name: new[name] for name in _VERDICT}
            upsert = DriverStatement.compile(
                statement.on_conflict_do_update(index_elements=["trace_id"], set_=changes),
                dialect,
                Trace.__table__,  # type: ignore[attr-defined]  # SQLModel's table
            )
            self._upserts[verdict] = upsert
        return upsert

    def close(self) -> None:
        """Nothing of its own: the engine is its owner's."""

    def get(self, trace_id: str) -> TraceRecord | None:
        try:
            with Session(self._engine) as session:
                row = session.get(Trace, trace_id)
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"the trace table cannot be read: {exc}") from exc
        return None if row is None else _record(row)

    def find(self, query: TraceQuery) -> list[TraceRecord]:
        statement = _filtered(select(Trace), query).order_by(col(Trace.at).desc(), col(Trace.trace_id))
        statement = statement.offset(max(0, query.offset)).limit(max(0, min(query.limit, MAX_PAGE)))
        try:
            with Session(self._engine) as session:
                return [_record(row) for row in session.exec(statement).all()]
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"the trace table cannot be read: {exc}") from exc

    def outcomes(self, model: str, since: float, *, limit: int = 1_000_000) -> list[CallOutcome]:
        """The calls of ``model`` (catalog name) that arrived at or after ``since``, oldest first, at most
        ``limit``: only the columns a canary analysis needs. ``StoreUnavailable``."""
        columns = (col(Trace.version), col(Trace.outcome), col(Trace.error_code), col(Trace.used_ms), col(Trace.at))
        statement = (
            sa_select(*columns)
            .where(col(Trace.model) == model, col(Trace.at) >= datetime.fromtimestamp(since, UTC))
            .order_by(col(Trace.at))
            .limit(limit)
        )
        try:
            with Session(self._engine) as session:
                rows = session.execute(statement).all()
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"the trace table cannot be read: {exc}") from exc
        return [CallOutcome(v, o, e, u, _timestamp(a)) for v, o, e, u, a in rows]

    def count(self, query: TraceQuery) -> int:
        statement = _filtered(select(func.count()).select_from(Trace), query)
        try:
            with Session(self._engine) as session:
                return int(session.exec(statement).one())
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"the trace table cannot be read: {exc}") from exc

    def prune(self, now: float, *, payload_max_age_s: float, row_max_age_s: float) -> Pruned:
        rows_before = datetime.fromtimestamp(now - row_max_age_s, UTC)
        payload_before = datetime.fromtimestamp(now - payload_max_age_s, UTC)
        try:
            with self._engine.begin() as connection:
                deleted = connection.execute(delete(Trace).where(col(Trace.at) < rows_before)).rowcount
                kept = (col(Trace.input) != "") | (col(Trace.output) != "")
                clear = update(Trace).where(col(Trace.at) < payload_before, kept).values(input="", output="")
                cleared = connection.execute(clear).rowcount
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"the trace table cannot be pruned: {exc}") from exc
        return Pruned(int(deleted or 0), int(cleared or 0))


def _groups(last: dict[str, TraceRecord]) -> list[tuple[bool, list[TraceRecord]]]:
    """A batch's records by ``verdict``, the others first (a verdict then wins over them), empty groups left out."""
    groups = [(verdict, [r for r in last.values() if r.verdict is verdict]) for verdict in (False, True)]
    return [(verdict, group) for verdict, group in groups if group]


def _filtered(statement: SelectOfScalar[S], query: TraceQuery) -> SelectOfScalar[S]:
    if query.identity is not None:
        statement = statement.where(col(Trace.identity) == query.identity)
    if query.task is not None:
        statement = statement.where(col(Trace.task) == query.task)
    if query.model is not None:
        statement = statement.where(col(Trace.model) == query.model)
    if query.outcome is not None:
        statement = statement.where(col(Trace.outcome) == query.outcome)
        if query.outcome != "answered":  # the term of the partial index's condition: SQLite then uses it
            statement = statement.where(text(_NOT_ANSWERED))  # the index's own condition: SQLite matches terms
    if query.channel is not None:
        statement = statement.where(col(Trace.channel) == query.channel)
    if query.since is not None:
        statement = statement.where(col(Trace.at) >= datetime.fromtimestamp(query.since, UTC))
    return statement
