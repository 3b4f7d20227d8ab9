"""Recording against a real redis-server: one snapshot and one audit event per job, whatever happens.

Two bridges recording at once, writes retried after their reply was lost, a
full queue, a Redis restart in the middle of the stream, and the real bridge
with the recorder as its ``on_served`` hook (jobs delivered twice included).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry

from examlops.adapters.redis import connect
from examlops.bootstrap.bridge import bus_client as make_bus_client
from examlops.core.errors import DeadlineExceeded, StoreUnavailable
from examlops.core.records import ServedInference
from examlops.core.settings import Settings
from examlops.monitoring.audit import INFERENCE_SERVED, STREAM, AuditTrail, Entry, Row, verify
from examlops.monitoring.recorder import Recorder, Tuning
from examlops.monitoring.snapshots import Snapshot, SnapshotStream, embedding_stats
from examlops.platform.redis_server import EmbeddedRedis
from tests.integration.conftest import free_port
from tests.integration.test_bus_bridge import ADDRESS, PAYLOAD, StandIn, bus_settings, running_bridge, standin

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

__all__ = ["standin"]  # the fixture, used by the bridge test below
SECRET = b"recording-secret"


def served(job: int | str, *, model: str = "JPCP", prediction: float = 0.25, caller: str = "user-1") -> ServedInference:
    reply = {"model": model, "alias": "Production", "version": "3", "run_id": "run-abc", "prediction": prediction}
    return ServedInference(
        job_id=f"job-{job}",
        address="addr",
        model=model,
        caller=caller,
        embedding=(0.5, -0.25, 1.0, 0.0),
        node_count=12,
        reply={**reply, "error": None, "job_id": f"job-{job}"},
        status=200,
        served_at=1_700_000_000.0 + (job if isinstance(job, int) else 0),
    )


def served_events(client: redis.Redis) -> list[dict[str, Any]]:
    found: Any = client.xrange(STREAM)
    return [json.loads(fields["data"]) for _, fields in found if fields["type"] == INFERENCE_SERVED]


class LosingReplies(AuditTrail):
    """A trail whose every third write runs and then fails as if its reply had been lost on the way back."""

    writes = 0

    def append_rows(self, rows: Sequence[Row], names: tuple[str, ...], *, call_key: str = "") -> int:
        result = super().append_rows(rows, names, call_key=call_key)
        self.writes += 1
        if self.writes % 3 == 1:
            raise StoreUnavailable("connection reset after the script ran")
        return result


def test_counts_are_one_to_one_with_two_bridges_writing_and_writes_retried_after_a_lost_reply(
    redis_server: str, client: redis.Redis
) -> None:
    clients = [connect(redis_server) for _ in range(2)]
    trails = [LosingReplies(c, SECRET) for c in clients]
    recorders = [Recorder(trail, tuning=Tuning(batch_size=16, max_backoff_s=0.01)).start() for trail in trails]

    def feed(recorder: Recorder, jobs: range) -> None:
        for job in jobs:
            recorder.record([served(job)])

    feeders = [
        threading.Thread(target=feed, args=(recorders[0], range(0, 250))),
        threading.Thread(target=feed, args=(recorders[1], range(250, 400))),  # another bridge's jobs
    ]
    try:
        for thread in feeders:
            thread.start()
        for thread in feeders:
            thread.join()
        assert all(recorder.close(30) for recorder in recorders)
    finally:
        for c in clients:
            c.close()
    stats = [recorder.stats() for recorder in recorders]
    assert all(trail.writes >= 2 for trail in trails), "every recorder lost at least one reply"
    assert sum(s.retried for s in stats) >= 2
    assert (sum(s.recorded for s in stats), sum(s.dropped for s in stats)) == (400, 0)
    snapshots = SnapshotStream(client).read("JPCP")
    events = served_events(client)
    assert Counter(s.job_id for s in snapshots) == Counter(f"job-{i}" for i in range(400))
    assert Counter(e["job_id"] for e in events) == Counter(f"job-{i}" for i in range(400))
    assert verify(client, SECRET, None).ok


def test_a_write_retried_with_its_call_key_writes_nothing_twice_and_leaves_no_key_per_job(
    client: redis.Redis,
) -> None:
    trail = AuditTrail(client, SECRET)
    entries = [Entry(INFERENCE_SERVED, "JPCP", {"job_id": f"job-{i}"}, 1_700_000_000.0 + i) for i in range(5)]
    written = trail.append_many(entries, call_key="examlops:recorded:batch:b1")
    assert all(event is not None for event in written)
    assert trail.append_many(entries, call_key="examlops:recorded:batch:b1") == [None] * 5
    assert len(served_events(client)) == 5
    assert trail.append_many(entries[:1], call_key="examlops:recorded:batch:b2")[0] is not None, "a new call"
    assert len(served_events(client)) == 6
    assert verify(client, SECRET, None).ok
    # The recorder: one short-lived key per batch written, none per job.
    recorder = Recorder(AuditTrail(client, SECRET), tuning=Tuning(batch_size=50, linger_s=0.5)).start()
    recorder.record([served(i) for i in range(200)])
    assert recorder.close(10) and recorder.stats().recorded == 200
    keys = [str(k) for k in client.scan_iter("examlops:recorded:*")]
    assert all(key.startswith("examlops:recorded:batch:") for key in keys)
    assert 2 + 4 <= len(keys) <= 2 + 200 // 50 + 1
    assert all(0 < client.ttl(key) <= 4200 for key in keys)


def test_a_snapshot_and_its_event_carry_the_reply_and_the_embedding_statistics(client: redis.Redis) -> None:
    recorder = Recorder(AuditTrail(client, SECRET)).start()
    recorder.record([served(1, model="CRCP", prediction=0.875, caller="alice")])
    assert recorder.close(10)
    [snapshot] = SnapshotStream(client).read("crcp")
    norm, mean, std = embedding_stats((0.5, -0.25, 1.0, 0.0))
    assert snapshot == Snapshot(
        model="CRCP",
        alias="Production",
        version="3",
        run_id="run-abc",
        prediction=0.875,
        norm=norm,
        mean=mean,
        std=std,
        node_count=12,
        job_id="job-1",
        user_id="alice",
        ts=1_700_000_001.0,
        status=200,
        code="",
        entry_id=snapshot.entry_id,
    )
    assert SnapshotStream(client).models() == ["crcp"]
    [event] = served_events(client)
    assert event == {
        "job_id": "job-1",
        "user_id": "alice",
        "alias": "Production",
        "version": "3",
        "run_id": "run-abc",
        "prediction": 0.875,
        "status": 200,
        "code": "",
    }


def test_past_its_bound_the_queue_drops_counts_and_logs_never_silently(
    client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    recorder = Recorder(AuditTrail(client, SECRET), tuning=Tuning(maxsize=5), registry=registry)
    with caplog.at_level(logging.ERROR, logger="examlops.monitoring.recorder"):
        recorder.record([served(i) for i in range(8)])
    assert recorder.stats().dropped == 3 and recorder.stats().queue_depth == 5
    assert registry.get_sample_value("examlops_recorder_dropped_total") == 3
    assert registry.get_sample_value("examlops_recorder_queue_depth") == 5
    assert len([r for r in caplog.records if "queue full" in r.message]) == 1, "one log line per burst"
    recorder.start()
    with caplog.at_level(logging.INFO, logger="examlops.monitoring.recorder"):
        assert recorder.close(10)
    assert recorder.stats().recorded == 5
    assert registry.get_sample_value("examlops_recorder_recorded_total") == 5
    assert len(served_events(client)) == 5
    cpu = recorder.stats().cpu_s
    assert cpu > 0 and registry.get_sample_value("examlops_recorder_cpu_seconds_total") == cpu
    assert any("5 recorded, 0 retries, 3 dropped" in r.message for r in caplog.records)


def test_redis_restarted_mid_stream_loses_no_record(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis", free_port())
    server.start()
    client = connect(server.url)
    registry = CollectorRegistry()
    recorder = Recorder(AuditTrail(client, SECRET), tuning=Tuning(max_backoff_s=0.2), registry=registry).start()
    try:
        for job in range(100):
            recorder.record([served(job)])
            time.sleep(0.002)
        server.stop()
        for job in range(100, 200):  # Redis is down: these wait in the queue
            recorder.record([served(job)])
        time.sleep(1.0)
        server.start()
        for job in range(200, 300):
            recorder.record([served(job)])
            time.sleep(0.002)
        assert recorder.close(30)
        stats = recorder.stats()
        assert (stats.recorded, stats.dropped) == (300, 0)
        assert stats.retried > 0
        assert registry.get_sample_value("examlops_recorder_retried_total") == stats.retried
        jobs = Counter(s.job_id for s in SnapshotStream(client).read("JPCP"))
        assert jobs == Counter(f"job-{i}" for i in range(300))
        assert Counter(e["job_id"] for e in served_events(client)) == jobs
        assert verify(client, SECRET, None).ok
    finally:
        client.close()
        server.stop()


def test_snapshots_are_trimmed_only_below_the_drift_checkpoint(client: redis.Redis) -> None:
    recorder = Recorder(AuditTrail(client, SECRET)).start()
    recorder.record([served(i) for i in range(10)])
    assert recorder.close(10)
    stream = SnapshotStream(client)
    ids = [s.entry_id for s in stream.read("JPCP")]
    assert stream.trim_below("JPCP", ids[-1]) == 0, "nobody consumed anything yet"
    assert stream.advance("JPCP", ids[4]) == ids[4]
    assert stream.advance("JPCP", ids[2]) == ids[4], "a checkpoint never moves back"
    assert [s.entry_id for s in stream.read_new("JPCP")] == ids[5:]
    assert stream.trim_below("JPCP", ids[-1]) == 4, "entries after the checkpoint stay"
    assert [s.entry_id for s in stream.read("JPCP")] == ids[4:]
    assert stream.trim_below("JPCP", ids[2]) == 0
    assert stream.checkpoint("JPCP") == ids[4] and stream.length("JPCP") == 6


async def test_the_bridge_records_every_bus_job_once_through_its_on_served_hook(
    tmp_path: Path, redis_server: str, client: redis.Redis, standin: StandIn
) -> None:
    settings: Settings = bus_settings(tmp_path, redis_server, standin.port)
    sync_client = connect(redis_server)
    recorder = Recorder(AuditTrail(sync_client, SECRET)).start()
    try:
        async with (
            make_bus_client(settings, caller="t") as bus_client,
            running_bridge(settings, on_served=recorder),
        ):
            good = [bus_client.request(ADDRESS, PAYLOAD, 10, job_id=f"bus-{i}") for i in range(60)]
            bad = [
                bus_client.request(ADDRESS, {"embedding": [1.0], "node_count": 3}, 10, job_id=f"bad-{i}")
                for i in range(5)
            ]
            replies = await asyncio.gather(*good, *bad)
            # Copies of answered jobs (a client's retry, a replay) are acked, never served or recorded again.
            for i in range(3):
                with pytest.raises(DeadlineExceeded):
                    await bus_client.request(ADDRESS, PAYLOAD, 1, job_id=f"bus-{i}")
        assert sum(reply["error"] is None for reply in replies) == 60
        assert recorder.close(10)
    finally:
        sync_client.close()
    snapshots = SnapshotStream(client).read("JPCP")
    assert Counter(s.job_id for s in snapshots) == Counter(
        [f"bus-{i}" for i in range(60)] + [f"bad-{i}" for i in range(5)]
    )
    assert sorted(s.code for s in snapshots if not s.ok) == ["invalid_input"] * 5
    assert all(s.norm > 0 and s.alias == "Production" and s.run_id == "run-1" for s in snapshots if s.ok)
    assert len(served_events(client)) == 65
    assert verify(client, SECRET, None).ok


def test_a_recorder_closed_while_redis_is_down_counts_what_it_could_not_write(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis", free_port())
    server.start()
    client = connect(server.url)
    recorder = Recorder(AuditTrail(client, SECRET), tuning=Tuning(max_backoff_s=0.1)).start()
    try:
        server.stop()
        recorder.record([served(i) for i in range(10)])
        assert not recorder.close(1.0)
        stats = recorder.stats()
        assert (stats.recorded, stats.dropped, stats.queue_depth) == (0, 10, 0)
        assert stats.retried > 0
    finally:
        client.close()
        server.stop()


def test_the_drift_flows_projected_reader_reads_one_field_and_legacy_snapshots(client: redis.Redis) -> None:
    from examlops.monitoring.snapshot_projection import ProjectedSnapshotReader
    from examlops.monitoring.snapshots import snapshot_of, stream_of

    reply = {"alias": "Production", "version": "4", "run_id": "r", "prediction": 0.625, "error": None}
    packed = snapshot_of(
        model="JPCP", reply=reply, status=200, embedding=[0.5, -0.25, 1.0], node_count=3, job_id="j1",
        user_id="u", ts=1_700_000_000.5,
    )  # fmt: skip
    legacy = {
        "model": "JPCP", "alias": "Production", "version": "3", "run_id": "r", "prediction": "0.5", "norm": "2.0",
        "mean": "0.1", "std": "0.3", "node_count": "12", "job_id": "j0", "user_id": "u name", "ts": "1700000000.25",
        "status": "200", "code": "",
    }  # fmt: skip
    stream = stream_of("JPCP")
    client.delete(stream)
    client.xadd(stream, legacy)  # type: ignore[arg-type]
    client.xadd(stream, packed.fields())  # type: ignore[arg-type]
    client.xadd(stream, {"s": '["not", "a snapshot"]'})
    rows = ProjectedSnapshotReader(SnapshotStream(client)).read("JPCP")
    assert [(r.version, r.ok, r.prediction, r.ts) for r in rows] == [
        ("3", True, 0.5, 1_700_000_000.25),
        ("4", True, 0.625, 1_700_000_000.5),
        ("?", False, 0.0, 0.0),
    ]
    assert (rows[1].norm, rows[1].mean, rows[1].std) == (packed.norm, packed.mean, packed.std)
