"""Recording against a real redis-server: one snapshot and one audit event per record, whatever happens.

Records are put on the records stream as the bridge's reply script puts them; recorders drain them in
process (the recording child and a bridge SIGKILLed mid-run are in ``test_recording_process``). Two
recorders at once, a recorder that died after writing and before settling, one that died holding what it
read, a Redis restart in the middle, and the real bridge writing the records.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from examlops.adapters.redis import connect
from examlops.bootstrap.bridge import bus_client as make_bus_client
from examlops.core.records import RECORDS_STREAM, ServedInference, embedding_stats
from examlops.core.settings import FailureSettings, HttpSettings, Settings
from examlops.monitoring.audit import INFERENCE_SERVED, STREAM, AuditTrail, verify
from examlops.monitoring.failure_store import RedisFailureStore
from examlops.monitoring.failures import FailureTracker
from examlops.monitoring.recording import AuditRecordSink, Recorder, RedisRecordStream
from examlops.monitoring.snapshots import Snapshot, SnapshotStream
from examlops.platform.redis_server import EmbeddedRedis
from tests.integration.test_bus_bridge import ADDRESS, PAYLOAD, StandIn, bus_settings, running_bridge, standin
from tests.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

__all__ = ["standin"]  # the fixture, used by the bridge test below
SECRET = b"recording-secret"
EMBEDDING = (0.5, -0.25, 1.0, 0.0)


def served(job: int | str, *, model: str = "JPCP", prediction: float = 0.25, caller: str = "user-1") -> ServedInference:
    reply = {"model": model, "alias": "Production", "version": "3", "run_id": "run-abc", "prediction": prediction}
    norm, mean, std = embedding_stats(EMBEDDING)
    return ServedInference(
        job_id=f"job-{job}",
        address="addr",
        model=model,
        caller=caller,
        node_count=12,
        reply={**reply, "error": None, "job_id": f"job-{job}"},
        status=200,
        served_at=1_700_000_000.0 + (job if isinstance(job, int) else 0),
        norm=norm,
        mean=mean,
        std=std,
    )


def add_records(client: redis.Redis, records: Iterable[ServedInference]) -> list[str]:
    """XADD each record as the reply script does: ``r`` and the reply's own fields."""
    pipe = client.pipeline(transaction=False)
    for record in records:
        body = orjson.dumps(dict(record.reply)).decode()
        pipe.xadd(
            RECORDS_STREAM, {"r": record.packed(), "job_id": record.job_id, "status": record.status, "body": body}
        )
    return [str(entry_id) for entry_id in pipe.execute()]


def recorder_on(
    client: redis.Redis, consumer: str, *, tracker: FailureTracker | None = None, **options: Any
) -> Recorder:
    stream = RedisRecordStream(client)
    stream.ensure_group()
    return Recorder(stream, AuditRecordSink(AuditTrail(client, SECRET), tracker), consumer, **options)


def drain(recorder: Recorder) -> None:
    stop = threading.Event()
    stop.set()
    recorder.run(stop)


def served_events(client: redis.Redis) -> list[dict[str, Any]]:
    found: Any = client.xrange(STREAM)
    return [json.loads(fields["data"]) for _, fields in found if fields["type"] == INFERENCE_SERVED]


def assert_one_to_one(client: redis.Redis, jobs: Iterable[str]) -> None:
    expected = Counter(jobs)
    assert Counter(s.job_id for s in SnapshotStream(client).read("JPCP")) == expected
    assert Counter(e["job_id"] for e in served_events(client)) == expected
    assert verify(client, SECRET, None).ok


async def test_the_bridge_writes_one_record_per_served_job_and_a_recorder_makes_them_one_to_one(
    tmp_path: Path, redis_server: str, client: redis.Redis, standin: StandIn
) -> None:
    # The default read timeout: the stand-in shares this process with the bridge and 65 jobs at once, and a
    # busy CI machine once stalled it past the 2 s of FAST_HTTP (45 of 60 jobs answered "did not answer in time").
    settings: Settings = bus_settings(tmp_path, redis_server, standin.port).model_copy(update={"http": HttpSettings()})
    async with make_bus_client(settings) as bus_client, running_bridge(settings):
        good = [bus_client.request(ADDRESS, PAYLOAD, 10, job_id=f"bus-{i}") for i in range(60)]
        bad = [
            bus_client.request(ADDRESS, {"embedding": [1.0], "node_count": 3}, 10, job_id=f"bad-{i}") for i in range(5)
        ]
        replies = await asyncio.gather(*good, *bad)
        for i in range(3):  # copies of answered jobs get their one reply again, never served or recorded again
            assert await bus_client.request(ADDRESS, PAYLOAD, 10, job_id=f"bus-{i}") == replies[i]
    errors = Counter(str(reply.get("code") or reply["error"]) for reply in replies[:60] if reply["error"] is not None)
    assert not errors, errors
    assert client.xlen(RECORDS_STREAM) == 65
    drain(recorder_on(client, "me"))
    snapshots = SnapshotStream(client).read("JPCP")
    assert_one_to_one(client, [f"bus-{i}" for i in range(60)] + [f"bad-{i}" for i in range(5)])
    assert sorted(s.code for s in snapshots if not s.ok) == ["invalid_input"] * 5
    assert all(s.norm > 0 and s.alias == "Production" and s.run_id == "run-1" for s in snapshots if s.ok)


async def test_past_its_bound_the_stream_takes_no_more_records_and_counts_them(
    redis_server: str, client: redis.Redis
) -> None:
    from examlops.adapters.redis import RedisPyCommands
    from examlops.bus.store import BusStore

    store = BusStore(RedisPyCommands(redis_server))
    try:
        for i in range(5):
            await store.finish(
                "examlops:bus:jobs:x", f"{i}-1", done_id=f"b-{i}", reply_to="examlops:bus:replies:c",
                reply={"job_id": f"b-{i}", "status": "200", "body": "{}"}, record=served(i).packed(),
                records_bound=3,
            )  # fmt: skip
    finally:
        await store.aclose()
    assert client.xlen(RECORDS_STREAM) == 3 and client.get("examlops:records:dropped") == "2"
    assert client.xlen("examlops:bus:replies:c") == 5, "every job is answered all the same"


def test_two_recorders_draining_at_once_write_each_record_once_and_leave_nothing_behind(
    redis_server: str, client: redis.Redis
) -> None:
    add_records(client, [served(i) for i in range(400)])
    clients = [connect(redis_server) for _ in range(2)]
    recorders = [recorder_on(c, f"r{n}", batch=16, linger_s=0) for n, c in enumerate(clients)]
    threads = [threading.Thread(target=drain, args=(r,)) for r in recorders]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        for c in clients:
            c.close()
    assert sum(r.stats().recorded for r in recorders) == 400 and all(r.stats().recorded for r in recorders)
    assert_one_to_one(client, [f"job-{i}" for i in range(400)])
    assert client.xlen(RECORDS_STREAM) == 0
    assert_once_keys_expire(client, 400)


def test_a_snapshot_and_its_event_carry_the_reply_and_the_embedding_statistics(client: redis.Redis) -> None:
    record = served(1, model="CRCP", prediction=0.875, caller="alice")
    add_records(client, [dataclasses.replace(record, reply={**record.reply, "trace": "ab" * 16})])
    drain(recorder_on(client, "me"))
    [snapshot] = SnapshotStream(client).read("crcp")
    norm, mean, std = embedding_stats(EMBEDDING)
    assert snapshot == Snapshot(
        model="CRCP", alias="Production", version="3", run_id="run-abc", prediction=0.875, norm=norm, mean=mean,
        std=std, node_count=12, job_id="job-1", user_id="alice", ts=1_700_000_001.0, status=200, code="",
        entry_id=snapshot.entry_id,
    )  # fmt: skip
    assert SnapshotStream(client).models() == ["crcp"]
    [event] = served_events(client)
    assert event == {
        "job_id": "job-1", "user_id": "alice", "alias": "Production", "version": "3", "run_id": "run-abc",
        "prediction": 0.875, "status": 200, "code": "", "trace": "ab" * 16,
    }  # fmt: skip


def test_what_a_dead_recorder_wrote_or_held_is_reclaimed_and_written_exactly_once(client: redis.Redis) -> None:
    add_records(client, [served(i) for i in range(30)])
    stream = RedisRecordStream(client)
    stream.ensure_group()
    sink = AuditRecordSink(AuditTrail(client, SECRET))
    wrote = stream.read("dead", 10, None)
    sink.write([record for _, record in wrote if record is not None])  # written; it died before settling
    stream.read("dead", 5, None)  # read, never written
    alive = recorder_on(client, "alive", batch=8, linger_s=0, reclaim_idle_s=0.2)
    drain(alive)  # the 15 nobody held
    assert alive.stats().recorded == 15 and client.xlen(RECORDS_STREAM) == 15
    alive._next_reclaim = 0.0
    time.sleep(0.3)
    drain(alive)
    assert alive.stats().reclaimed == 15 and client.xlen(RECORDS_STREAM) == 0
    assert_one_to_one(client, [f"job-{i}" for i in range(30)])
    assert_once_keys_expire(client, 30)


def test_a_recorder_that_stalled_past_the_reclaim_time_writes_nothing_twice(client: redis.Redis) -> None:
    add_records(client, [served(i) for i in range(10)])
    stream = RedisRecordStream(client)
    stream.ensure_group()
    stalled = stream.read("stalled", 10, None)  # read, then stalled (a nice-19 child on busy cores)
    alive = recorder_on(client, "alive", batch=8, linger_s=0, reclaim_idle_s=0.2)
    time.sleep(0.3)
    alive._next_reclaim = 0.0
    drain(alive)  # reclaims, writes and settles the stalled recorder's records
    assert alive.stats().reclaimed == 10 and client.xlen(RECORDS_STREAM) == 0
    AuditRecordSink(AuditTrail(client, SECRET)).write([record for _, record in stalled if record is not None])
    assert_one_to_one(client, [f"job-{i}" for i in range(10)])


def assert_once_keys_expire(client: redis.Redis, count: int) -> None:
    """Settled records keep their once keys for a while (180 s by default), then Redis drops them."""
    keys = list(client.scan_iter("examlops:recorded:*"))
    assert len([k for k in keys if ":failures:" not in k]) == count
    assert all(0 < client.pttl(k) <= 4_200_000 for k in keys)
    assert all(0 < client.pttl(k) <= 180_000 for k in keys if ":failures:" not in k)


def test_recorded_replies_feed_the_shared_failure_window(redis_server: str, client: redis.Redis) -> None:
    tracker = FailureTracker(RedisFailureStore(client), FailureSettings(window=50))
    failed = {"error": "model raised", "prediction": 0.0, "code": "inference_failed", "inference_failed": True}
    records = [served(i) for i in range(30)]
    records += [ServedInference(f"f-{i}", "a", "JPCP", "u", 1, failed, 500, 1.0) for i in range(20)]
    add_records(client, records)
    drain(recorder_on(client, "me", tracker=tracker, batch=7, linger_s=0))
    window = RedisFailureStore(client).window("JPCP", 50)
    assert (window.size, window.failures) == (50, 20)


def test_redis_restarted_mid_stream_loses_no_record(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis", free_port())
    server.start()
    client = connect(server.url)
    try:
        add_records(client, [served(i) for i in range(100)])
        recorder = recorder_on(client, "me", batch=10, linger_s=0)
        stop = threading.Event()
        thread = threading.Thread(target=recorder.run, args=(stop,))
        thread.start()
        server.stop()
        server.start()  # appendonly: the stream and the group come back
        add_records(client, [served(i) for i in range(100, 200)])
        stop.set()
        thread.join(60)
        assert recorder.stats().recorded == 200
        assert_one_to_one(client, [f"job-{i}" for i in range(200)])
    finally:
        client.close()
        server.stop()


def test_snapshots_are_trimmed_only_below_the_drift_checkpoint(client: redis.Redis) -> None:
    add_records(client, [served(i) for i in range(10)])
    drain(recorder_on(client, "me"))
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


def test_entries_that_are_not_records_or_were_deleted_do_not_stall_the_recorder(client: redis.Redis) -> None:
    ids = add_records(client, [served(i) for i in range(3)])
    client.xadd(RECORDS_STREAM, {"x": "not a record"})
    stream = RedisRecordStream(client)
    stream.ensure_group()
    stream.read("dead", 10, None)
    client.xdel(RECORDS_STREAM, ids[0])  # pending with a dead consumer, and gone
    alive = recorder_on(client, "alive", linger_s=0, reclaim_idle_s=0.05)
    time.sleep(0.1)
    drain(alive)
    # Redis 6.2 hands the deleted entry over in the claim (then it is settled as dropped); 7.0 forgets it.
    assert alive.stats().recorded == 2 and alive.stats().dropped in (1, 2)
    assert_one_to_one(client, ["job-1", "job-2"])
    assert client.xlen(RECORDS_STREAM) == 0
    assert client.xpending(RECORDS_STREAM, "recorders")["pending"] == 0


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
