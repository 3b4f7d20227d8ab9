"""Audit retention against a real redis-server and SQLite: archive while appenders write, the trim script's
refusals, `exa audit archive`, and the retention flow's tasks (called directly, without Prefect's engine).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from examlops.adapters.redis import connect
from examlops.bootstrap import sql_engine
from examlops.bootstrap.control import ControlPlane, audit_access, audit_archive_dir
from examlops.cli.audit import audit_app
from examlops.core.errors import Conflict
from examlops.core.settings import DEV_SECRET, Settings
from examlops.monitoring.audit import STREAM, AuditTrail
from examlops.monitoring.audit.archive import Archiver
from examlops.monitoring.audit.checkpoints import SqlCheckpointStore
from examlops.monitoring.audit.segments import ArchiveFiles
from examlops.monitoring.audit.store import ARCHIVED, RedisAuditStore, Watermark
from examlops.monitoring.audit.verify import tail, verify
from examlops.monitoring.snapshots import MODELS, SnapshotStream, stream_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SECRET = DEV_SECRET.encode()


@pytest.fixture
def redis_settings(settings: Settings, redis_server: str) -> Settings:
    return Settings(home=settings.home, redis={"url": redis_server})


@pytest.fixture
def checkpoints(settings: Settings) -> Iterator[SqlCheckpointStore]:
    engine = sql_engine(settings)
    yield SqlCheckpointStore(engine)
    engine.dispose()


def stream_seqs(client: redis.Redis) -> list[int]:
    found: Any = client.xrange(STREAM)
    return [int(fields["seq"]) for _id, fields in found]


def archived_seqs(files: ArchiveFiles) -> list[int]:
    return [int(record["seq"]) for _where, record in files.records()]


def test_archive_runs_beside_eight_appenders_lose_nothing_and_copy_nothing_twice(
    redis_server: str, client: redis.Redis, checkpoints: SqlCheckpointStore, tmp_path: Path
) -> None:
    clients = [connect(redis_server) for _ in range(8)]
    trails = [AuditTrail(c, SECRET, checkpoints, checkpoint_every=25) for c in clients]
    files = ArchiveFiles(tmp_path / "archive")
    archiver = Archiver(RedisAuditStore(client), checkpoints, SECRET, files, page=30)
    start = threading.Barrier(9)

    def write(index: int) -> None:
        start.wait()
        for i in range(150):
            trails[index].append("test.concurrent", f"writer-{index}", {"i": i})

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    runs = []
    try:
        for thread in threads:
            thread.start()
        start.wait()
        while any(thread.is_alive() for thread in threads):
            runs.append(archiver.run())
        for thread in threads:
            thread.join()
        for trail in trails:  # the last event is signed by the trail that wrote it
            trail.checkpoint_now()
        runs.append(archiver.run())
    finally:
        for c in clients:
            c.close()
    assert sum(run.archived for run in runs) == len(archived_seqs(files)), "each archived event once"
    assert sorted(archived_seqs(files) + stream_seqs(client)) == list(range(1, 1201))
    assert len(files.segments()) > 1, "the archive never ran while the writers appended; the test proves nothing"
    report = verify(client, SECRET, checkpoints, archive=files)
    assert report.ok and (report.events, report.last_seq) == (1200, 1200), report.broken
    assert report.archived == len(archived_seqs(files))


def test_the_trim_script_refuses_what_it_did_not_archive(client: redis.Redis, checkpoints: SqlCheckpointStore) -> None:
    trail = AuditTrail(client, SECRET, checkpoints)
    events = [trail.append("t", "s", {"i": i}) for i in range(6)]
    entry_ids = [entry_id for entry_id, _fields in client.xrange(STREAM)]
    store = RedisAuditStore(client)
    third = events[2]
    assert third is not None
    with pytest.raises(Conflict, match="no longer in the stream"):
        store.trim_archived(0, Watermark(3, "f" * 64, entry_ids[2]))
    assert store.trim_archived(0, Watermark(3, third.hash, entry_ids[2])) == 3
    assert stream_seqs(client) == [4, 5, 6] and store.watermark() == Watermark(3, third.hash, entry_ids[2])
    assert store.trim_archived(0, Watermark(3, third.hash, entry_ids[2])) == 0, "already done: nothing more"
    fifth = events[4]
    assert fifth is not None
    with pytest.raises(Conflict, match="another archiver moved"):
        store.trim_archived(0, Watermark(5, fifth.hash, entry_ids[4]))
    assert stream_seqs(client) == [4, 5, 6] and client.hget(ARCHIVED, "seq") == "3"


def test_exa_audit_archive_then_verify_and_tail_read_archive_and_stream_as_one(
    client: redis.Redis, redis_settings: Settings, checkpoints: SqlCheckpointStore
) -> None:
    trail = AuditTrail(client, SECRET, checkpoints, checkpoint_every=5)
    for i in range(12):
        trail.append("traffic.changed", "AC", {"i": i})
    env = {"EXAMLOPS_REDIS__URL": redis_settings.redis_url, "EXAMLOPS_HOME": str(redis_settings.home)}
    runner = CliRunner()
    result = runner.invoke(audit_app, ["archive", "--json"], env=env)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["archived"], report["first_seq"], report["last_seq"], report["trimmed"]) == (10, 1, 10, 10)
    assert Path(report["segment"]).parent == audit_archive_dir(redis_settings)
    assert stream_seqs(client) == [11, 12]
    assert "nothing new to archive" in runner.invoke(audit_app, ["archive"], env=env).output
    result = runner.invoke(audit_app, ["verify", "--json"], env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) | {"checkpoints": 0} == {
        "ok": True, "events": 12, "archived": 10, "last_seq": 12, "checkpoints": 0, "broken": None,
        "aliases_unaccounted": [], "aliases_unchecked": None, "aliases_not_covered": [],
    }  # fmt: skip
    result = runner.invoke(audit_app, ["tail", "-n", "4", "--json"], env=env)
    assert [event["seq"] for event in json.loads(result.stdout)] == [9, 10, 11, 12]

    [segment] = ArchiveFiles(audit_archive_dir(redis_settings)).segments()
    segment.write_text(segment.read_text().replace('{\\"i\\":3}', '{\\"i\\":33}'))
    result = runner.invoke(audit_app, ["verify"], env=env)
    assert result.exit_code == 1 and "seq 4 (edited)" in result.output and f"{segment.name}:4" in result.output


def test_snapshots_past_their_maximum_age_are_trimmed_consumed_or_not(client: redis.Redis) -> None:
    now = 1_800_000_000.0
    for age_s in (900, 500, 100, 10):
        client.xadd(stream_of("AC"), {"s": "[]"}, id=f"{int((now - age_s) * 1000)}-0")
    client.sadd(MODELS, "ac")
    stream = SnapshotStream(client)
    assert stream.trim_older_than("AC", 600, now) == 1
    assert stream.trim_older_than("AC", 600, now) == 0
    assert stream.trim_older_than("AC", 60, now) == 2 and stream.length("AC") == 1


def test_the_retention_flows_tasks_archive_the_trail_and_trim_old_snapshots(
    client: redis.Redis, redis_settings: Settings
) -> None:
    from examlops.flows.retention import archive_audit, trim_snapshots

    old = f"{int((time.time() - 3600) * 1000)}-0"
    client.xadd(stream_of("JPCP"), {"s": "[]"}, id=old)
    client.xadd(stream_of("JPCP"), {"s": "[]"})
    client.sadd(MODELS, "jpcp")
    with audit_access(redis_settings) as audit:
        trail = AuditTrail(audit.store.redis, audit.secret, audit.checkpoints, checkpoint_every=4)
        for i in range(9):
            trail.append("alias.moved", "JPCP", {"i": i})
    report = archive_audit.fn(redis_settings)
    assert (report["archived"], report["archive_last_seq"]) == (8, 8) and stream_seqs(client) == [9]
    plane = ControlPlane(redis_settings)
    try:
        assert trim_snapshots.fn(plane, 600.0, time.time()) == {"jpcp": 1}
    finally:
        plane.snapshot_stream.redis.close()
    assert client.xlen(stream_of("JPCP")) == 1
    with audit_access(redis_settings) as audit:
        assert verify(audit.store, audit.secret, audit.checkpoints, archive=audit.archive).ok
        assert [e.seq for e in tail(audit.store, 3, archive=audit.archive)] == [7, 8, 9]


def test_exa_audit_tail_needs_redis_only(client: redis.Redis, redis_settings: Settings) -> None:
    AuditTrail(client, SECRET).append("t", "s", {"i": 1})
    env = {
        "EXAMLOPS_REDIS__URL": redis_settings.redis_url,
        "EXAMLOPS_HOME": str(redis_settings.home),
        "EXAMLOPS_DATABASE_URL": "postgresql://127.0.0.1:1/unreachable",
    }
    result = CliRunner().invoke(audit_app, ["tail", "--json"], env=env)
    assert result.exit_code == 0, result.output
    assert [event["seq"] for event in json.loads(result.stdout)] == [1]
