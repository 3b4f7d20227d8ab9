"""Serving's trace writer process against real SQLite: writes land, a killed writer is replaced, a writer whose
environment names another database refuses, and closing ends it."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from examlops.bootstrap import upgrade_database
from examlops.bootstrap.sql import sql_engine
from examlops.bootstrap.trace_writer import ChildTraceStore
from examlops.core.errors import StoreUnavailable
from examlops.core.settings import Settings
from examlops.tracing import TraceRecord
from examlops.tracing.sql_store import SqlTraceStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def record() -> TraceRecord:
    return TraceRecord(
        trace_id=uuid.uuid4().hex, at=time.time(), channel="http", outcome="answered", error_code="", model="JPCP",
        alias="Production", version="1", identity="admin", used_ms=3.0, node="n1", batch_id="b1", batch_size=4,
        queue_wait_ms=1.0, predict_ms=2.0, status=200,
    )  # fmt: skip


def priorities(pid: int) -> set[int]:
    return {os.getpriority(os.PRIO_PROCESS, int(t.name)) for t in Path(f"/proc/{pid}/task").iterdir()}


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("EXAMLOPS_HOME", str(tmp_path / "state"))  # what the writer process reads
    settings = Settings()
    upgrade_database(settings)
    return settings


def test_records_written_through_the_child_are_in_sql_and_a_killed_child_is_replaced(settings: Settings) -> None:
    engine = sql_engine(settings)
    store = ChildTraceStore(settings, SqlTraceStore(engine))
    try:
        first = [record() for _ in range(50)]
        assert store.add(first) == 50
        stored = store.get(first[0].trace_id)
        assert stored is not None and (stored.model, stored.identity, stored.batch_size) == ("JPCP", "admin", 4)
        process = store._process
        assert process is not None and process.pid is not None and process.pid != os.getpid()
        assert priorities(process.pid) == {19}  # ``tracing.nice``'s default, in every thread of the child
        os.kill(process.pid, signal.SIGKILL)
        process.join(10)
        second = [record()]
        try:
            written = store.add(second)  # a dead writer is seen and replaced before the batch is sent
        except StoreUnavailable:  # or it died with the batch in flight: the sink retries it
            written = store.add(second)
        assert written == 1 and store._process is not process
        assert store.get(second[0].trace_id) is not None
        assert store.prune(time.time() + 10, payload_max_age_s=1.0, row_max_age_s=5.0).deleted == 51
    finally:
        store.close()
        engine.dispose()
    assert store._process is None


def test_the_writer_lowers_its_priority_by_the_setting_its_environment_gives(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXAMLOPS_TRACING__NICE", "5")
    engine = sql_engine(settings)
    store = ChildTraceStore(settings, SqlTraceStore(engine))
    try:
        assert store.add([record()]) == 1
        assert store._process is not None and store._process.pid is not None
        assert priorities(store._process.pid) == {min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)}
    finally:
        store.close()
        engine.dispose()


def test_a_writer_whose_environment_names_another_database_writes_nothing(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = sql_engine(settings)
    store = ChildTraceStore(settings, SqlTraceStore(engine))
    monkeypatch.setenv("EXAMLOPS_HOME", str(tmp_path / "elsewhere"))
    try:
        with pytest.raises(RuntimeError, match="another database"):
            store.add([record()])
    finally:
        store.close()
        engine.dispose()
