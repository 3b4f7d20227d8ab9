"""The recording process against a real redis-server: the bridge's default way of writing its records.

Every record written once with the counters reported back, the child at a low
priority, started again after it was killed (what it held counted as dropped,
never silently), deaf to SIGINT and SIGTERM until its stdin closes, and Redis
down and back in the middle of the stream.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from examlops.adapters.redis import connect
from examlops.bootstrap import upgrade_database
from examlops.bootstrap.bridge import bus_client as make_bus_client
from examlops.bootstrap.recording import bridge_recording, recording_process_argv, settings_json
from examlops.core.errors import DeadlineExceeded
from examlops.core.settings import RecordingSettings, RedisSettings, Settings
from examlops.monitoring.audit import verify
from examlops.monitoring.recorder import Tuning
from examlops.monitoring.recorder_process import RecorderProcess
from examlops.monitoring.snapshots import SnapshotStream
from examlops.platform.redis_server import EmbeddedRedis
from tests.integration.conftest import free_port
from tests.integration.test_bus_bridge import ADDRESS, PAYLOAD, StandIn, bus_settings, running_bridge, standin
from tests.integration.test_recording import served, served_events
from tests.unit.monitoring.test_recorder_process import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SECRET = "recording-process-secret"
__all__ = ["standin"]  # the fixture, used by the bridge test below


def settings_for(tmp_path: Path, redis_url: str) -> Settings:
    settings = Settings(home=tmp_path / "home", redis=RedisSettings(url=redis_url), secret=SecretStr(SECRET))
    upgrade_database(settings)  # as `exa up` does first: the recording child writes audit checkpoints
    return settings


def recorder_for(settings: Settings, registry: CollectorRegistry | None = None) -> RecorderProcess:
    return RecorderProcess(
        recording_process_argv(), settings_json(settings), Tuning(max_backoff_s=0.2), registry=registry, restart_s=0.1
    ).start()


def test_the_bridge_records_through_a_child_at_nice_19_once_per_job(
    tmp_path: Path, redis_server: str, client: redis.Redis
) -> None:
    settings = settings_for(tmp_path, redis_server)
    assert settings.recording.process, "the process is the default"
    registry = CollectorRegistry()
    with bridge_recording(settings, registry) as recorder:
        assert isinstance(recorder, RecorderProcess)
        assert recorder.pid is not None and recorder.pid != os.getpid()
        wait_for(lambda: recorder.connected, "the child's first report")
        # os.nice applies to the calling thread on Linux: every thread of the child must be at 19.
        tasks = Path(f"/proc/{recorder.pid}/task")
        wait_for(
            lambda: {os.getpriority(os.PRIO_PROCESS, int(t.name)) for t in tasks.iterdir()} == {19},
            "nice 19 in every thread of the child",
        )
        for job in range(300):
            recorder.record([served(job)])
        wait_for(lambda: recorder.stats().recorded == 300, "300 records")
        child = recorder.pid
    assert recorder.pid is None and child is not None
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # flushed and exited when the bridge closed its stdin
    stats = recorder.stats()
    assert (stats.recorded, stats.dropped, stats.queue_depth, recorder.restarts) == (300, 0, 0, 0)
    assert registry.get_sample_value("examlops_recorder_recorded_total") == 300
    jobs = Counter(s.job_id for s in SnapshotStream(client).read("JPCP"))
    assert jobs == Counter(f"job-{i}" for i in range(300))
    assert Counter(e["job_id"] for e in served_events(client)) == jobs
    assert verify(client, SECRET.encode(), None).ok


def test_without_the_process_setting_the_bridge_records_from_its_own_thread(
    tmp_path: Path, redis_server: str, client: redis.Redis
) -> None:
    settings = settings_for(tmp_path, redis_server).model_copy(update={"recording": RecordingSettings(process=False)})
    with bridge_recording(settings) as recorder:
        assert not isinstance(recorder, RecorderProcess)
        recorder.record([served(job) for job in range(20)])
    assert recorder.stats().recorded == 20
    assert len(SnapshotStream(client).read("JPCP")) == 20


def test_a_killed_child_is_started_again_and_the_counters_carry_on(
    tmp_path: Path, redis_server: str, client: redis.Redis
) -> None:
    registry = CollectorRegistry()
    recorder = recorder_for(settings_for(tmp_path, redis_server), registry)
    try:
        recorder.record([served(job) for job in range(100)])
        wait_for(lambda: recorder.stats().recorded == 100, "the first 100 records")
        first = recorder.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: recorder.connected and recorder.pid != first, "a new child", timeout=20)
        recorder.record([served(job) for job in range(100, 200)])
        assert recorder.close(30)
    finally:
        recorder.close(1)
    stats = recorder.stats()
    assert (stats.recorded, stats.dropped, stats.queue_depth) == (200, 0, 0)
    assert recorder.restarts == 1
    assert registry.get_sample_value("examlops_recorder_recorded_total") == 200
    jobs = Counter(s.job_id for s in SnapshotStream(client).read("JPCP"))
    assert jobs == Counter(f"job-{i}" for i in range(200))
    assert len(served_events(client)) == 200


def test_what_a_killed_child_held_is_counted_as_dropped_and_logged(
    tmp_path: Path, redis_server: str, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = recorder_for(settings_for(tmp_path, redis_server))
    try:
        wait_for(lambda: recorder.connected, "the child's first report")
        stopped = recorder.pid
        assert stopped is not None
        os.kill(stopped, signal.SIGSTOP)  # it reads nothing more: what is shipped now stays in its pipe
        recorder.record([served(job) for job in range(50)])
        wait_for(lambda: recorder.held() == 50, "50 records shipped to the stopped child")
        os.kill(stopped, signal.SIGKILL)
        wait_for(lambda: recorder.stats().dropped == 50, "the dead child's records counted")
        recorder.record([served(job) for job in range(50, 60)])
        wait_for(lambda: recorder.stats().recorded == 10, "the 10 records after the kill")
        assert recorder.close(30)
    finally:
        recorder.close(1)
    stats = recorder.stats()
    assert (stats.recorded, stats.dropped, stats.queue_depth) == (10, 50, 0)
    assert "holding 50 records" in caplog.text
    assert Counter(s.job_id for s in SnapshotStream(client).read("JPCP")) == Counter(f"job-{i}" for i in range(50, 60))


def test_the_child_ignores_sigint_and_sigterm_and_flushes_when_its_stdin_closes(
    tmp_path: Path, redis_server: str, client: redis.Redis
) -> None:
    recorder = recorder_for(settings_for(tmp_path, redis_server))
    try:
        child = recorder.pid
        assert child is not None
        recorder.record([served(job) for job in range(30)])
        # Once it writes, its handlers are set (a signal during its start-up, before they are, ends it).
        wait_for(lambda: recorder.stats().recorded == 30, "the first 30 records")
        os.kill(child, signal.SIGINT)
        os.kill(child, signal.SIGTERM)
        recorder.record([served(job) for job in range(30, 60)])
        assert recorder.close(30)
    finally:
        recorder.close(1)
    assert (recorder.stats().recorded, recorder.stats().dropped, recorder.restarts) == (60, 0, 0)
    assert len(SnapshotStream(client).read("JPCP")) == 60


def test_redis_down_and_back_mid_stream_loses_no_record_in_the_child(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis", free_port())
    server.start()
    client = connect(server.url)
    recorder = recorder_for(settings_for(tmp_path, server.url))
    try:
        recorder.record([served(job) for job in range(100)])
        wait_for(lambda: recorder.stats().recorded == 100, "the first 100 records")
        server.stop()
        recorder.record([served(job) for job in range(100, 200)])  # they wait in the child
        wait_for(lambda: recorder.stats().retried > 0, "a retry in the child")
        assert recorder.stats().queue_depth == 100
        server.start()
        recorder.record([served(job) for job in range(200, 300)])
        assert recorder.close(30)
        stats = recorder.stats()
        assert (stats.recorded, stats.dropped) == (300, 0)
        jobs = Counter(s.job_id for s in SnapshotStream(client).read("JPCP"))
        assert jobs == Counter(f"job-{i}" for i in range(300))
        assert verify(client, SECRET.encode(), None).ok
    finally:
        recorder.close(1)
        client.close()
        server.stop()


def test_a_close_that_times_out_stops_the_child_and_counts_every_unwritten_record(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis", free_port())
    server.start()
    recorder = recorder_for(settings_for(tmp_path, server.url))
    try:
        wait_for(lambda: recorder.connected, "the child's first report")
        server.stop()
        recorder.record([served(job) for job in range(10)])
        child = recorder.pid
        assert not recorder.close(1.0)
        stats = recorder.stats()
        assert (stats.recorded, stats.dropped, stats.queue_depth) == (0, 10, 0)
        assert recorder.pid is None and child is not None
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)
    finally:
        recorder.close(1)
        server.stop()


async def test_the_bridge_records_every_bus_job_once_through_the_recording_process(
    tmp_path: Path, redis_server: str, client: redis.Redis, standin: StandIn
) -> None:
    settings = bus_settings(tmp_path, redis_server, standin.port)
    with bridge_recording(settings) as recorder:
        assert isinstance(recorder, RecorderProcess)
        async with (
            make_bus_client(settings, caller="t") as bus_client,
            running_bridge(settings, on_served=recorder),
        ):
            jobs = [bus_client.request(ADDRESS, PAYLOAD, 10, job_id=f"bus-{i}") for i in range(80)]
            replies = await asyncio.gather(*jobs)
            for i in range(3):  # copies of answered jobs are acked, never served or recorded again
                with pytest.raises(DeadlineExceeded):
                    await bus_client.request(ADDRESS, PAYLOAD, 1, job_id=f"bus-{i}")
    assert sum(reply["error"] is None for reply in replies) == 80
    assert (recorder.stats().recorded, recorder.stats().dropped) == (80, 0)
    jobs_seen = Counter(s.job_id for s in SnapshotStream(client).read("JPCP"))
    assert jobs_seen == Counter(f"bus-{i}" for i in range(80))
    assert Counter(e["job_id"] for e in served_events(client)) == jobs_seen
    assert verify(client, settings.secret.get_secret_value().encode(), None).ok
