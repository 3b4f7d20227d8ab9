"""Eight processes append to one audit chain at once, one of them SIGKILLed mid-way: the chain stays whole.

Each writer appends its own numbered events; the chain's compare-and-set loop
must serialise them without losing, doubling or reordering any writer's
events, the shared once key must yield exactly one event, and
``examlops.monitoring.audit.verify`` must pass against the signed checkpoints
that the writers wrote to one SQL database meanwhile.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
import redis

from examlops.bootstrap import sql_engine, upgrade_database
from examlops.core.settings import RedisSettings, Settings
from examlops.monitoring.audit import STREAM, SqlCheckpointStore, VerifyReport, verify
from tests.faults.checker import Figures
from tests.faults.cluster import REPO
from tests.faults.conftest import LONG, Reporter
from tests.faults.history import History, Outcome

pytestmark = pytest.mark.timeout(600 if LONG else 180)

WRITERS = 8
EVENTS = 1500 if LONG else 150


def written_by(client: redis.Redis, subject: str) -> int:
    return sum(1 for _id, fields in client.xrange(STREAM) if fields["subject"] == subject)


def test_eight_concurrent_writers_and_one_killed_leave_a_chain_that_verifies(
    tmp_path: Path, redis_url: str, report: Reporter
) -> None:
    settings = Settings(home=tmp_path, redis=RedisSettings(url=redis_url))
    upgrade_database(settings)
    writers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.faults.audit_writer", str(tmp_path), redis_url, str(w), str(EVENTS)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for w in range(WRITERS)
    ]
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        deadline = time.monotonic() + 60
        while written_by(client, "writer-0") < EVENTS // 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        writers[0].send_signal(signal.SIGKILL)  # mid-append, quite possibly inside a compare-and-set retry
        outputs = [w.communicate(timeout=120)[0].decode(errors="replace") for w in writers]
        events = [fields for _id, fields in client.xrange(STREAM)]
        engine = sql_engine(settings)
        try:
            verified = verify(client, settings.secret.get_secret_value().encode(), SqlCheckpointStore(engine))
        finally:
            engine.dispose()
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
        client.close()
    assert writers[0].returncode == -signal.SIGKILL
    assert [w.returncode for w in writers[1:]] == [0] * (WRITERS - 1), outputs
    by_writer: dict[str, list[int]] = defaultdict(list)
    for fields in events:
        if fields["type"] == "fault.write":
            by_writer[fields["subject"]].append(json.loads(fields["data"])["n"])
    for w in range(1, WRITERS):
        assert by_writer[f"writer-{w}"] == list(range(EVENTS)), f"writer {w} lost, doubled or reordered events"
    killed = by_writer["writer-0"]
    assert EVENTS // 4 <= len(killed) < EVENTS and killed == list(range(len(killed)))  # a prefix, nothing doubled
    assert sum(1 for fields in events if fields["type"] == "fault.once") == 1
    assert verified.ok, verified.broken
    assert verified.events == len(events)
    assert verified.checkpoints > 0
    report_figures(report, by_writer, verified, len(events))


def report_figures(reporter: Reporter, by_writer: dict[str, list[int]], verified: VerifyReport, events: int) -> None:
    """The run as a row of the reliability table: each event a writer meant to append is an operation; the
    killed writer's are those it appended (the rest it never sent). No bus job, so no reply or record figures."""
    history = History()
    lost: list[str] = []
    doubled: list[str] = []
    for w in range(WRITERS):
        seen = by_writer[f"writer-{w}"]
        meant = range(EVENTS) if w else range(len(seen))
        for n in meant:
            history.ok(history.invoke("audit", f"writer-{w}:{n}"), {"error": None})
        lost += [f"writer-{w}:{n}" for n in meant if n not in seen]
        doubled += [f"writer-{w}:{n}" for n in set(seen) if seen.count(n) > 1]
    figures = Figures(
        invoked=len(history.operations),
        ok=history.count(Outcome.OK),
        failed=0,
        unknown=0,
        answered_with_error=0,
        lost=lost,
        answered_twice=doubled,
        unknown_applied_twice=None,
        unrecorded=None,
        recorded_twice=None,
        recorded_unanswered=None,
        audit_ok=verified.ok,
        audit_events=verified.events,
        audit_problem="" if verified.broken is None else f"{verified.broken.kind} at {verified.broken.seq}",
        records_dropped=None,
        records_left=None,
    )
    reporter(
        f"{WRITERS} concurrent audit writers, 1 SIGKILLed",
        f"{WRITERS} processes x {EVENTS} events on one chain ({events} written)",
        "SIGKILL of one writer after a quarter of its events",
        figures,
    )
