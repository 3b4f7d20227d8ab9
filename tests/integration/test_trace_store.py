"""The trace store on real SQLite and Postgres: one row per trace id, verdicts, filters and paging, retention."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from examlops.bootstrap import sql_engine, upgrade_database
from examlops.core.settings import Settings
from examlops.tracing import TraceQuery, TraceRecord, TraceSink, new_trace_id
from examlops.tracing.sql_store import SqlTraceStore, Trace, _row

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NOW = 1_800_000_000.0
DAY = 86400.0


@pytest.fixture
def engine(tmp_path: Path, database_url: str) -> Iterator[Engine]:
    settings = Settings(home=tmp_path, database_url=database_url)
    upgrade_database(settings)
    engine = sql_engine(settings)
    yield engine
    engine.dispose()


def trace(trace_id: str | None = None, **fields: object) -> TraceRecord:
    base = TraceRecord(trace_id=trace_id or new_trace_id(), at=NOW, channel="http", outcome="answered", node="n1")
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]  # test data of the right types


def test_an_id_stored_already_keeps_its_first_record_and_only_fills_what_it_left_empty(engine: Engine) -> None:
    store = SqlTraceStore(engine)
    first = trace(channel="bus", outcome="failed", error_code="inference_failed", status=500, version="1")
    assert store.add([first]) == 1
    again = trace(first.trace_id, outcome="answered", status=200, version="2", batch_id="b-1", batch_size=4)
    assert store.add([again, trace()]) == 1
    stored = store.get(first.trace_id)
    assert stored is not None
    assert (stored.outcome, stored.error_code, stored.status, stored.version) == (
        "failed",
        "inference_failed",
        500,
        "1",
    )
    assert (stored.batch_id, stored.batch_size) == ("b-1", 4)
    assert store.count(TraceQuery()) == 2


@pytest.mark.parametrize("verdict_first", [False, True])
def test_a_verdict_sets_the_outcome_whichever_record_is_written_first(engine: Engine, verdict_first: bool) -> None:
    store = SqlTraceStore(engine)
    trace_id = new_trace_id()
    serving = trace(trace_id, channel="bus", status=200, version="1", batch_id="b-9", batch_size=3, predict_ms=1.5)
    bridge = trace(trace_id, channel="bus", outcome="refused", error_code="deadline_exceeded", status=200, verdict=True)
    for batch in ([bridge], [serving]) if verdict_first else ([serving], [bridge]):
        store.add(batch)
    stored = store.get(trace_id)
    assert stored is not None and not stored.verdict
    assert (stored.outcome, stored.error_code, stored.status) == ("refused", "deadline_exceeded", 200)
    assert (stored.version, stored.batch_id, stored.batch_size, stored.predict_ms) == ("1", "b-9", 3, 1.5)
    assert store.count(TraceQuery()) == 1


def test_filters_and_pages_read_the_newest_first(engine: Engine) -> None:
    store = SqlTraceStore(engine)
    records = [
        trace(at=NOW + i, model="JPCP" if i % 2 else "CRCP", outcome="refused" if i % 3 == 0 else "answered")
        for i in range(10)
    ]
    store.add(records)
    jpcp = store.find(TraceQuery(model="JPCP", limit=100))
    assert [r.at for r in jpcp] == [NOW + i for i in (9, 7, 5, 3, 1)]
    assert store.count(TraceQuery(model="JPCP", outcome="refused")) == 2  # 3 and 9
    page = store.find(TraceQuery(since=NOW + 4, limit=2, offset=2))
    assert [r.at for r in page] == [NOW + 7, NOW + 6]
    assert store.count(TraceQuery(since=NOW + 4, limit=2, offset=2)) == 6


def test_retention_clears_payloads_then_deletes_rows(engine: Engine) -> None:
    store = SqlTraceStore(engine)
    fresh = trace(at=NOW - 1 * DAY, input="sha256:a", output="sha256:b")
    old = trace(at=NOW - 10 * DAY, input="sha256:c", output="sha256:d")
    ancient = trace(at=NOW - 40 * DAY, input="sha256:e")
    store.add([fresh, old, ancient])
    done = store.prune(NOW, payload_max_age_s=7 * DAY, row_max_age_s=30 * DAY)
    assert (done.deleted, done.cleared) == (1, 1)
    assert store.get(ancient.trace_id) is None
    kept_old, kept_fresh = store.get(old.trace_id), store.get(fresh.trace_id)
    assert kept_old is not None and (kept_old.input, kept_old.output) == ("", "")
    assert kept_fresh is not None and (kept_fresh.input, kept_fresh.output) == ("sha256:a", "sha256:b")


def test_the_sink_prunes_with_its_own_clock_while_it_writes(engine: Engine) -> None:
    store = SqlTraceStore(engine)
    clock = [NOW]
    sink = TraceSink(store, linger_s=0.0, prune_every_s=DAY, wall=lambda: clock[0])
    sink.start()
    try:
        kept = trace(at=NOW, input="sha256:x")
        sink.put(kept)
        assert sink.flush(10)
        clock[0] = NOW + 8 * DAY  # past the payload retention: the next round clears it
        sink.put(trace(at=NOW + 8 * DAY))
        deadline = time.monotonic() + 10
        while (stored := store.get(kept.trace_id)) is not None and stored.input:
            assert time.monotonic() < deadline, "the payload was not cleared"
            time.sleep(0.05)
        clock[0] = NOW + 31 * DAY  # past the row retention
        sink.put(trace(at=NOW + 31 * DAY))
        while store.get(kept.trace_id) is not None:
            assert time.monotonic() < deadline, "the row was not deleted"
            time.sleep(0.05)
    finally:
        sink.close(10)
    assert sink.stats().pruned >= 1 and store.count(TraceQuery()) == 2


def test_the_driver_writes_the_rows_sqlalchemy_writes(engine: Engine) -> None:
    """``add`` bypasses SQLAlchemy's per-row processing (on SQLite: ``at`` as text, floats as they are): the
    stored values and their SQL types are those of SQLAlchemy's own insert of the same records."""
    records = [
        trace(at=NOW + 0.5, model="JPCP", used_ms=3, queue_wait_ms=1.25, batch_size=4, budget_ms=50),
        trace(at=NOW, error_code="bad_input", outcome="refused", status=422, used_ms=0.0),
        trace(at=1.000001, identity="admin", task="pavement", predict_ms=None, budget_remaining_ms=-2.5),
    ]
    by_orm = [dataclasses.replace(r, trace_id=new_trace_id()) for r in records]
    SqlTraceStore(engine).add(records)
    with engine.begin() as connection:
        connection.execute(Trace.__table__.insert(), [_row(r) for r in by_orm])  # type: ignore[attr-defined]
    names = [c.name for c in Trace.__table__.columns if c.name != "trace_id"]  # type: ignore[attr-defined]
    typed = ", ".join(f"{n}, {'typeof' if engine.dialect.name == 'sqlite' else 'pg_typeof'}({n})" for n in names)
    with engine.connect() as connection:
        rows = {
            trace_id: tuple(values)
            for trace_id, *values in connection.exec_driver_sql(f"SELECT trace_id, {typed} FROM trace")
        }
    for written, reference in zip(records, by_orm, strict=True):
        assert rows[written.trace_id] == rows[reference.trace_id]


def test_outcome_and_task_filters_find_rows_the_partial_indexes_leave_out(engine: Engine) -> None:
    """``ix_trace_outcome`` holds rows not answered and ``ix_trace_task`` rows with a task (revision 0009):
    every filter still finds exactly its rows, answered and task-less ones included."""
    store = SqlTraceStore(engine)
    outcomes = ("answered", "refused", "failed")
    store.add([trace(at=NOW + i, outcome=outcomes[i % 3], task="t.a" if i % 2 else None) for i in range(12)])
    assert [store.count(TraceQuery(outcome=o)) for o in outcomes] == [4, 4, 4]
    assert store.count(TraceQuery(task="t.a")) == 6
    assert store.count(TraceQuery(task="t.a", outcome="failed")) == 2
    assert [r.at for r in store.find(TraceQuery(outcome="refused", limit=2))] == [NOW + 10, NOW + 7]
    if engine.dialect.name == "sqlite":
        with engine.connect() as connection:
            plan = connection.exec_driver_sql(
                "EXPLAIN QUERY PLAN SELECT count(*) FROM trace WHERE outcome = 'failed' AND outcome <> 'answered'"
            ).all()
        assert "ix_trace_outcome" in str(plan)


def test_a_record_the_database_refuses_costs_only_itself(engine: Engine) -> None:
    store = SqlTraceStore(engine)
    sink = TraceSink(store, batch=64, linger_s=5.0)
    sink.start()
    records = [trace(model="JP\x00CP" if i == 17 else "JPCP") for i in range(64)]
    try:
        for one in records:
            sink.put(one)
        assert sink.flush(20)
    finally:
        sink.close(10)
    refused = engine.dialect.name == "postgresql"  # Postgres refuses a NUL in a text; SQLite stores it
    assert all(store.get(one.trace_id) is not None for i, one in enumerate(records) if i != 17)
    assert (store.get(records[17].trace_id) is None) is refused
    assert sink.stats().dropped == int(refused) and sink.stats().written == 64 - int(refused)


def test_a_store_out_of_connections_is_unavailable_not_a_refusal_of_the_records(tmp_path: Path) -> None:
    from examlops.core.errors import StoreUnavailable
    from examlops.db.engine import create_sql_engine

    settings = Settings(home=tmp_path)
    upgrade_database(settings)
    engine = create_sql_engine(settings.sql_url, pool_size=1, max_overflow=0, pool_timeout=0.2)
    held = engine.connect()  # the pool's only connection
    try:
        with pytest.raises(StoreUnavailable):
            SqlTraceStore(engine).add([trace()])
    finally:
        held.close()
    assert SqlTraceStore(engine).add([trace()]) == 1
    engine.dispose()
