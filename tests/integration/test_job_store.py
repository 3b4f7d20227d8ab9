"""The offline job store in real SQL (SQLite and Postgres): conditional writes that never move a job back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from examlops.bootstrap import sql_engine, upgrade_database
from examlops.core.settings import Settings
from examlops.jobs.model import Job, JobState
from examlops.jobs.sql import SqlJobStore

pytestmark = pytest.mark.integration


@pytest.fixture
def engine(database_url: str, tmp_path: Path) -> Iterator[Engine]:
    settings = Settings(home=tmp_path, database_url=database_url)
    upgrade_database(settings)
    engine = sql_engine(settings)
    yield engine
    engine.dispose()


def job(job_id: str, created_at: float, identity: str = "alice") -> Job:
    return Job(
        id=job_id,
        identity=identity,
        task="t.one",
        model="JPCP",
        alias="Production",
        budget_ms=60_000,
        created_at=created_at,
        expires_at=created_at + 60,
        state=JobState.QUEUED,
        total=10,
        batch_size=3,
        instances_path="/x/instances.jsonl",
        trace_id="a" * 32,
    )


def test_a_job_is_stored_and_listed_as_it_was_given(engine: Engine) -> None:
    store = SqlJobStore(engine)
    store.add(job("j1", 100.0))
    store.add(job("j2", 200.0, identity="bob"))
    assert store.get("j1") == job("j1", 100.0)
    assert store.get("nope") is None
    assert [j.id for j in store.list()] == ["j2", "j1"]
    assert [j.id for j in store.list("alice")] == ["j1"]


def test_claims_go_oldest_first_and_a_held_lease_is_not_taken_until_it_runs_out(engine: Engine) -> None:
    store = SqlJobStore(engine)
    store.add(job("j1", 100.0))
    store.add(job("j2", 200.0))
    first = store.claim("node-a", now=1000.0, lease_s=30)
    assert first is not None and (first.id, first.state) == ("j1", JobState.RUNNING)
    second = store.claim("node-b", now=1000.0, lease_s=30)
    assert second is not None and second.id == "j2"
    assert store.claim("node-c", now=1010.0, lease_s=30) is None
    taken_over = store.claim("node-c", now=1031.0, lease_s=30)
    assert taken_over is not None and taken_over.id == "j1"
    assert store.release("node-b") == 1
    again = store.claim("node-d", now=1032.0, lease_s=30)
    assert again is not None and again.id == "j2"


def test_a_batch_is_recorded_once_by_its_owner_while_the_job_is_live(engine: Engine) -> None:
    store = SqlJobStore(engine)
    store.add(job("j1", 100.0))
    assert store.claim("node-a", now=1000.0, lease_s=30) is not None
    progress = {"answered": 3, "errors": 1, "results_bytes": 5_000_000_000, "lease_until": 1060.0}
    assert store.record_batch("j1", "node-a", done_batches=1, **progress)
    assert not store.record_batch("j1", "node-a", done_batches=1, **progress)  # the same batch twice
    assert not store.record_batch("j1", "node-b", done_batches=2, **progress)  # not its owner
    recorded = store.get("j1")
    assert recorded is not None and (recorded.done_batches, recorded.errors) == (1, 1)
    assert recorded.results_bytes == 5_000_000_000  # past 32 bits: a results file of many gigabytes
    cancelled = store.cancel("j1", at=1001.0)
    assert cancelled is not None and cancelled.state is JobState.CANCELLED and cancelled.finished_at == 1001.0
    assert not store.record_batch("j1", "node-a", done_batches=2, **progress)
    assert store.finish("j1", JobState.DONE, at=1002.0) is None
    assert store.cancel("j1", at=1003.0) is None
    assert store.claim("node-a", now=1004.0, lease_s=30) is None


def test_a_lease_is_renewed_only_by_its_owner_while_the_job_is_live(engine: Engine) -> None:
    store = SqlJobStore(engine)
    store.add(job("j1", 100.0))
    assert store.claim("node-a", now=1000.0, lease_s=30) is not None
    assert store.renew("j1", "node-a", lease_until=1100.0)
    assert store.claim("node-b", now=1050.0, lease_s=30) is None  # the renewed lease holds past the first
    assert not store.renew("j1", "node-b", lease_until=1200.0)  # not its owner
    taken_over = store.claim("node-b", now=1101.0, lease_s=30)
    assert taken_over is not None and taken_over.id == "j1"
    assert not store.renew("j1", "node-a", lease_until=1200.0)  # the old owner learns it lost the job
    assert store.finish("j1", JobState.DONE, at=1102.0) is not None
    assert not store.renew("j1", "node-b", lease_until=1200.0)  # an ended job has no lease
