"""The history checker on histories and Redis contents made by hand: each broken promise is named."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import redis

from examlops.bootstrap import sql_engine, upgrade_database
from examlops.bus import wire
from examlops.core.records import ServedInference
from examlops.core.settings import RedisSettings, Settings
from examlops.monitoring.audit import STREAM, AuditTrail, SqlCheckpointStore
from examlops.monitoring.recording.sink import AuditRecordSink
from tests.faults import conftest as faults_conftest
from tests.faults import http_load
from tests.faults.checker import check
from tests.faults.conftest import Reporter
from tests.faults.history import History

ADDRESS = "00000000-0000-0000-0000-000000000001"
OK_BODY = {"model": "JPCP", "alias": "Production", "version": "1", "prediction": 0.5, "error": None}
_entries = itertools.count(1)


@pytest.fixture
def settings(tmp_path: Path, redis_url: str) -> Settings:
    settings = Settings(home=tmp_path, redis=RedisSettings(url=redis_url))
    upgrade_database(settings)
    return settings


def reply(client: redis.Redis, job_id: str, body: dict[str, object] = OK_BODY, *, resent: bool = False) -> None:
    fields = {"job_id": job_id, "status": "200", "body": orjson.dumps(body), **({"resent": "1"} if resent else {})}
    client.xadd(wire.replies_stream("c1"), fields)


def record(settings: Settings, client: redis.Redis, *job_ids: str) -> None:
    """What a recorder writes for these jobs: a snapshot and an ``inference.served`` event each."""
    engine = sql_engine(settings)
    try:
        trail = AuditTrail(client, settings.secret.get_secret_value().encode(), SqlCheckpointStore(engine))
        sink = AuditRecordSink(trail)
        served = [
            ServedInference(
                job, ADDRESS, "JPCP", "tests", 12, OK_BODY, 200, time.time(), entry_id=f"{next(_entries)}-0"
            )
            for job in job_ids
        ]
        sink.write(served)
        sink.close()
    finally:
        engine.dispose()


def answered(history: History, *job_ids: str) -> None:
    for job in job_ids:
        history.ok(history.invoke("bus", job), {**OK_BODY, "job_id": job})


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url, decode_responses=True)


def test_a_clean_run_has_no_violations(settings: Settings, client: redis.Redis) -> None:
    history = History()
    answered(history, "a", "b")
    history.unknown(history.invoke("bus", "c"), "StoreUnavailable")  # never reached Redis: fine
    for job in ("a", "b"):
        reply(client, job)
    record(settings, client, "a", "b")
    figures = check(history, settings.redis_url, settings, settle_s=1)
    assert figures.violations() == []
    assert (figures.ok, figures.unknown, figures.audit_events) == (2, 1, 2)


def test_a_job_answered_twice_and_an_unknown_one_applied_twice_are_named(
    settings: Settings, client: redis.Redis
) -> None:
    history = History()
    answered(history, "a")
    history.unknown(history.invoke("bus", "u"), "DeadlineExceeded", submitted=True)
    for job in ("a", "a", "u", "u"):
        reply(client, job)
    record(settings, client, "a", "u")
    figures = check(history, settings.redis_url, settings, settle_s=1)
    assert figures.answered_twice == ["a", "u"]
    assert figures.unknown_applied_twice == ["u"]


def test_a_resent_reply_to_a_retry_is_no_second_answer_unless_it_differs(
    settings: Settings, client: redis.Redis
) -> None:
    history = History()
    for job in ("same", "other"):
        history.unknown(history.invoke("bus", job), "DeadlineExceeded", submitted=True)
        answered(history, job)  # the retry, with the same job id
        reply(client, job)
    reply(client, "same", resent=True)
    reply(client, "other", {**OK_BODY, "prediction": 0.9}, resent=True)
    record(settings, client, "same", "other")
    figures = check(history, settings.redis_url, settings, settle_s=1)
    assert figures.answered_twice == figures.unknown_applied_twice == []
    assert figures.resent == 2 and figures.resent_differs == ["other"]
    assert figures.violations() == ["resent_differs: 1 (other)"]


def test_an_unknown_job_recorded_twice_is_applied_twice_with_one_reply(settings: Settings, client: redis.Redis) -> None:
    history = History()
    history.unknown(history.invoke("bus", "u"), "DeadlineExceeded", submitted=True)
    answered(history, "u")
    reply(client, "u")
    record(settings, client, "u")
    record(settings, client, "u")  # served again by a retry that missed the done key: a second snapshot and event
    figures = check(history, settings.redis_url, settings, settle_s=1)
    assert figures.answered_twice == [] and figures.unknown_applied_twice == ["u"]
    assert figures.recorded_twice == ["u"]


def test_the_summary_holds_every_figure_and_none_for_what_http_load_cannot_measure() -> None:
    history = History()
    history.ok(history.invoke("JPCP", "p-0"), {"status": 200, "error": None})
    summary = http_load.figures(history).summary()
    names = ("duplicated", "unrecorded", "recorded_twice", "recorded_unanswered", "unknown_applied_twice")
    for name in (*names, "lost_in_aof_window"):
        assert summary[name] is None
    assert summary["audit_ok"] is None and summary["records_left"] is None and summary["lost"] == 0


def test_the_table_names_each_run_and_says_n_a_for_what_was_not_measured(tmp_path: Path) -> None:
    report = tmp_path / "report.jsonl"
    history = History()
    history.ok(history.invoke("JPCP", "p-0"), {"status": 200, "error": None})
    figures = http_load.figures(history)
    older = Reporter({"started": "2026-12-01T00:00:00Z", "commit": "aaaaaaa", "command": "pytest old"})
    newer = Reporter({"started": "2026-12-06T00:00:00Z", "commit": "bbbbbbb", "command": "pytest new"})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(faults_conftest, "REPORT", str(report))
        older("http scenario", "1 call", "none", figures)
        newer("http scenario", "1 call", "none", figures)
    table = Path(__file__).resolve().parents[2] / "bench" / "faults_table.py"
    last = subprocess.run([sys.executable, str(table), str(report)], capture_output=True, text=True, check=True)
    assert "at commit bbbbbbb, command `pytest new`" in last.stdout and "aaaaaaa" not in last.stdout
    [row] = [line for line in last.stdout.splitlines() if line.startswith("| http scenario")]
    assert row.split(" | ")[4:9] == ["n/a"] * 5  # lost in the AOF window, duplicated .. recorded unanswered
    every = subprocess.run(
        [sys.executable, str(table), str(report), "--all"], capture_output=True, text=True, check=True
    )
    assert every.stdout.index("aaaaaaa") < every.stdout.index("bbbbbbb")


def test_a_submitted_job_without_a_reply_is_lost(settings: Settings, client: redis.Redis) -> None:
    history = History()
    history.unknown(history.invoke("bus", "gone"), "DeadlineExceeded", submitted=True)
    figures = check(history, settings.redis_url, settings, settle_s=1)
    assert figures.lost == ["gone"]


def test_an_answered_job_gone_after_a_redis_sigkill_counts_apart_only_within_two_seconds_before_it(
    settings: Settings, client: redis.Redis
) -> None:
    clock = iter([0.0, 0.2, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).__next__
    history = History(clock=clock)
    history.ok(history.invoke("bus", "old"), OK_BODY)  # answered at 0.2: 2.8 s before the kill
    history.ok(history.invoke("bus", "recent"), OK_BODY)  # answered at 2.0: 1 s before it
    history.mark("fault:redis_sigkill_0")  # t=3
    history.mark("heal:redis_restarted_0")  # t=4
    history.ok(history.invoke("bus", "after"), OK_BODY)  # answered at 6.0, after the heal
    figures = check(history, settings.redis_url, settings, settle_s=1)  # no reply of the three is left
    assert figures.lost_in_aof_window == ["recent"]
    assert figures.lost == ["after", "old"]
    assert figures.summary()["lost_in_aof_window"] == 1
    assert figures.violations() == ["lost: 2 (after, old)"]


def test_a_missing_or_doubled_record_is_named_and_an_unrecorded_reply_code_needs_none(
    settings: Settings, client: redis.Redis
) -> None:
    history = History()
    answered(history, "bare", "twice", "late")
    reply(client, "bare")
    reply(client, "twice")
    reply(client, "late", {"error": "too late", "code": "deadline_exceeded", "prediction": 0.0})
    record(settings, client, "twice")
    record(settings, client, "twice")  # another entry id: the once key cannot catch it
    figures = check(history, settings.redis_url, settings, settle_s=1)
    assert figures.unrecorded == ["bare"]
    assert figures.recorded_twice == ["twice"]
    assert figures.answered_with_error == 0  # the history's values were answers; Redis holds the late error


def test_an_edited_audit_event_breaks_the_chain(settings: Settings, client: redis.Redis) -> None:
    history = History()
    answered(history, "a")
    reply(client, "a")
    record(settings, client, "a")
    entry_id, fields = client.xrange(STREAM)[0]
    client.xadd(STREAM, {**fields, "subject": "CRCP"}, id="*")
    client.xdel(STREAM, entry_id)
    figures = check(history, settings.redis_url, settings, settle_s=1)
    assert not figures.audit_ok
    assert any("audit chain broken" in v for v in figures.violations())


def test_time_to_recover_is_measured_from_the_heal_mark(settings: Settings, client: redis.Redis) -> None:
    clock = iter([0.0, 1.0, 5.0, 6.0, 7.5]).__next__
    history = History(clock=clock)
    early = history.invoke("bus", "early")  # t=0
    history.ok(early, OK_BODY)  # t=1
    history.mark("heal:redis")  # t=5
    late = history.invoke("bus", "late")  # t=6
    history.ok(late, OK_BODY)  # t=7.5
    reply(client, "early")
    reply(client, "late")
    record(settings, client, "early", "late")
    assert check(history, settings.redis_url, settings, settle_s=1).recover_s == {"heal:redis": 2.5}
