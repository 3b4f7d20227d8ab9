"""Offline jobs in SQL (SQLModel): the ``OfflineJob`` table and ``SqlJobStore``, the ``JobStore`` adapter.

One row per job, keyed by its id; times are UNIX seconds (floats), so both SQLite and Postgres hand back
what was stored. Every conditional write is one ``UPDATE ... WHERE`` whose row count says whether it
happened (no read-then-write race between processes): ``_update`` over ``_live`` (the job is queued or
running), and ``_RENEW`` and ``_RECORD`` over ``_HELD`` (live, and the caller's). Database errors are
``StoreUnavailable``.

The calls the runner makes on every batch (``get``, ``renew``, ``record_batch``) run Core statements built
once at import, with bound parameters: through the ORM session, with a statement built per call, they took
about three times the CPU, in a thread that shares serving's interpreter lock with its event loop
(bench/RESULTS.md, "the job runner's per-batch SQL").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import BigInteger, Column, Index, Table, bindparam, or_, update
from sqlalchemy import select as sql_select
from sqlalchemy.engine import CursorResult, Engine
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import Field, Session, SQLModel, col, select

from examlops.db.session import store_session, store_transaction
from examlops.jobs.model import LIVE_STATES, Job, JobState

_LIVE = [state.value for state in LIVE_STATES]


class OfflineJob(SQLModel, table=True):
    __tablename__ = "offline_job"
    __table_args__ = (
        Index("ix_offline_job_identity", "identity"),
        Index("ix_offline_job_state", "state"),
    )

    id: str = Field(primary_key=True, max_length=32)
    identity: str
    task: str
    model: str
    alias: str
    budget_ms: float
    created_at: float
    expires_at: float
    state: str
    total: int
    batch_size: int
    instances_path: str
    trace_id: str = Field(max_length=32)
    done_batches: int = 0
    answered: int = 0
    errors: int = 0
    results_bytes: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    error: str = ""
    finished_at: float | None = None
    owner: str | None = None
    lease_until: float | None = None


_TABLE: Table = OfflineJob.__table__  # type: ignore[attr-defined]  # SQLModel declares it on table models only
_C = _TABLE.c
_HELD = (_C.id == bindparam("job_id"), _C.state.in_(_LIVE), _C.owner == bindparam("held_by"))
_GET = sql_select(_TABLE).where(_C.id == bindparam("job_id"))
_RENEW = update(_TABLE).where(*_HELD).values(lease_until=bindparam("new_lease_until"))
_RECORD = (
    update(_TABLE)
    .where(*_HELD, _C.done_batches == bindparam("before"))
    .values(
        done_batches=bindparam("new_done_batches"),
        answered=bindparam("new_answered"),
        errors=bindparam("new_errors"),
        results_bytes=bindparam("new_results_bytes"),
        lease_until=bindparam("new_lease_until"),
    )
)
_JOB_FIELDS = [name for name in OfflineJob.model_fields if name not in ("owner", "lease_until")]


def _job(row: Mapping[Any, Any]) -> Job:
    """The ``Job`` of a row's columns (its lease, ``owner`` and ``lease_until``, is the store's alone)."""
    values: dict[str, Any] = {name: row[name] for name in _JOB_FIELDS}
    values["state"] = JobState(values["state"])
    return Job(**values)


class SqlJobStore:
    """The job rows (contract: ``ports.JobStore``)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def _session(self, doing: str) -> AbstractContextManager[Session]:
        return store_session(self._engine, f"{doing} offline jobs")

    def add(self, job: Job) -> None:
        with self._session("add to") as session:
            row = OfflineJob(**{name: getattr(job, name) for name in OfflineJob.model_fields if hasattr(job, name)})
            row.state = job.state.value
            session.add(row)
            session.commit()

    def get(self, job_id: str) -> Job | None:
        with store_transaction(self._engine, "read offline jobs") as connection:
            row = connection.execute(_GET, {"job_id": job_id}).mappings().first()
            return None if row is None else _job(row)

    def list(self, identity: str | None = None, *, limit: int = 100) -> list[Job]:
        with self._session("read") as session:
            query = select(OfflineJob).order_by(col(OfflineJob.created_at).desc()).limit(limit)
            if identity is not None:
                query = query.where(col(OfflineJob.identity) == identity)
            return [_job(row.model_dump()) for row in session.exec(query).all()]

    def claim(self, owner: str, now: float, lease_s: float) -> Job | None:
        free = or_(col(OfflineJob.owner).is_(None), col(OfflineJob.owner) == owner, col(OfflineJob.lease_until) < now)
        with self._session("claim") as session:
            candidates: Sequence[str] = session.exec(
                select(OfflineJob.id)
                .where(col(OfflineJob.state).in_(_LIVE), free)
                .order_by(col(OfflineJob.created_at))
                .limit(8)
            ).all()
            for job_id in candidates:
                taken = _update(
                    session,
                    [*_live(job_id), free],
                    owner=owner,
                    lease_until=now + lease_s,
                    state=JobState.RUNNING.value,
                )
                if taken == 1:
                    return _reread(session, job_id)
        return None

    def record_batch(
        self,
        job_id: str,
        owner: str,
        *,
        done_batches: int,
        answered: int,
        errors: int,
        results_bytes: int,
        lease_until: float,
    ) -> bool:
        values = {
            "job_id": job_id,
            "held_by": owner,
            "before": done_batches - 1,
            "new_done_batches": done_batches,
            "new_answered": answered,
            "new_errors": errors,
            "new_results_bytes": results_bytes,
            "new_lease_until": lease_until,
        }
        with store_transaction(self._engine, "record a batch of offline jobs") as connection:
            return connection.execute(_RECORD, values).rowcount == 1

    def renew(self, job_id: str, owner: str, lease_until: float) -> bool:
        values = {"job_id": job_id, "held_by": owner, "new_lease_until": lease_until}
        with store_transaction(self._engine, "renew a lease on offline jobs") as connection:
            return connection.execute(_RENEW, values).rowcount == 1

    def finish(self, job_id: str, state: JobState, *, error: str = "", at: float) -> Job | None:
        assert state.final, f"{state} is not a final state"
        return self._end(job_id, state, error, at)

    def cancel(self, job_id: str, at: float) -> Job | None:
        return self._end(job_id, JobState.CANCELLED, "cancelled by its caller", at)

    def _end(self, job_id: str, state: JobState, error: str, at: float) -> Job | None:
        with self._session("end") as session:
            ended = _update(
                session, _live(job_id), state=state.value, error=error, finished_at=at, owner=None, lease_until=None
            )
            return _reread(session, job_id) if ended == 1 else None

    def release(self, owner: str) -> int:
        with self._session("release") as session:
            return _update(session, [col(OfflineJob.owner) == owner], owner=None, lease_until=None)


def _live(job_id: str) -> list[ColumnElement[bool]]:
    """The job ``job_id`` while it is live (queued or running)."""
    return [col(OfflineJob.id) == job_id, col(OfflineJob.state).in_(_LIVE)]


def _update(session: Session, where: Sequence[ColumnElement[bool]], **values: Any) -> int:
    """One conditional write, committed: how many rows it changed (0: the condition no longer held, so
    nothing changed)."""
    result = session.exec(update(OfflineJob).where(*where).values(**values))
    session.commit()
    assert isinstance(result, CursorResult)
    return int(result.rowcount)


def _reread(session: Session, job_id: str) -> Job | None:
    """The job as the database holds it now (after a write of this session)."""
    row = session.connection().execute(_GET, {"job_id": job_id}).mappings().first()
    return None if row is None else _job(row)
