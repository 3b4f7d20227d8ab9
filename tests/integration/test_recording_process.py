"""The recording child against a real redis-server, and a bridge SIGKILLed between reply and record.

The child is a bridge's default way of writing its records: started with multiprocessing, at nice 19, its
settings from its own environment; started again when killed, reading what it had left first. Two bridge
processes share the records stream: one is SIGKILLed with its replies written and its records unwritten,
and the other's recorder drains them, so served : snapshot : audit event stays 1:1:1.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from examlops.bootstrap import upgrade_database
from examlops.bootstrap.bridge import bus_client
from examlops.bootstrap.recording import bridge_recording
from examlops.core.records import RECORDS_STREAM
from examlops.core.settings import Settings
from examlops.monitoring.audit import verify
from examlops.monitoring.snapshots import SnapshotStream
from tests.integration.servers import known_token
from tests.integration.test_bus_bridge import (
    ADDRESS,
    PAYLOAD,
    TOKEN,
    StandIn,
    replies_per_job,
    start_bridge_process,
    until,
)
from tests.integration.test_recording import add_records, served, served_events

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SECRET = "recording-process-secret"


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def settings(tmp_path: Path, redis_server: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings given through the environment, which the recording child reads as its own."""
    monkeypatch.setenv("EXAMLOPS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EXAMLOPS_REDIS__URL", redis_server)
    monkeypatch.setenv("EXAMLOPS_SECRET", SECRET)
    settings = Settings()
    upgrade_database(settings)  # as `exa up` does first: the recording child writes audit checkpoints
    return settings


def priorities(pid: int) -> set[int]:
    return {os.getpriority(os.PRIO_PROCESS, int(t.name)) for t in Path(f"/proc/{pid}/task").iterdir()}


def test_the_bridges_recording_child_runs_at_nice_19_and_writes_each_record_once(
    settings: Settings, client: redis.Redis
) -> None:
    with bridge_recording(settings, "test-bridge") as child:
        pid = child.pid
        assert pid is not None and pid != os.getpid()
        wait_for(lambda: priorities(pid) == {19}, "nice 19 in every thread of the child")
        add_records(client, [served(i) for i in range(300)])
        wait_for(lambda: client.xlen(RECORDS_STREAM) == 0, "the child drained the stream")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # asked to stop, it drained and exited
    jobs = [f"job-{i}" for i in range(300)]
    assert Counter(s.job_id for s in SnapshotStream(client).read("JPCP")) == Counter(jobs)
    assert Counter(e["job_id"] for e in served_events(client)) == Counter(jobs)
    assert verify(client, SECRET.encode(), None).ok


def test_the_child_ignores_sigint_and_sigterm_sent_to_its_group_and_stops_only_after_its_bridge(
    settings: Settings, client: redis.Redis
) -> None:
    with bridge_recording(settings, "test-bridge") as child:
        pid = child.pid
        assert pid is not None
        wait_for(lambda: priorities(pid) == {19}, "the child connected")
        os.kill(pid, signal.SIGINT)  # Ctrl-C, or `exa down`, reaches the bridge's whole group
        os.kill(pid, signal.SIGTERM)
        add_records(client, [served(i) for i in range(50)])
        wait_for(lambda: client.xlen(RECORDS_STREAM) == 0, "the child drained the stream")
        assert child.pid == pid and child.restarts == 0
    assert len(SnapshotStream(client).read("JPCP")) == 50


def test_a_killed_child_is_started_again_and_writes_what_it_had_read(settings: Settings, client: redis.Redis) -> None:
    with bridge_recording(settings, "test-bridge") as child:
        first = child.pid
        assert first is not None
        wait_for(lambda: priorities(first) == {19}, "the child connected")
        os.kill(first, signal.SIGSTOP)  # it reads nothing more; what it was blocked reading waits in its socket
        add_records(client, [served(i) for i in range(100)])
        time.sleep(0.5)
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: child.pid not in (None, first), "a new child", timeout=20)
        wait_for(lambda: client.xlen(RECORDS_STREAM) == 0, "the new child drained the stream")
        assert child.restarts == 1
    jobs = Counter(f"job-{i}" for i in range(100))
    assert Counter(s.job_id for s in SnapshotStream(client).read("JPCP")) == jobs
    assert Counter(e["job_id"] for e in served_events(client)) == jobs


async def test_a_bridge_killed_between_reply_and_record_leaves_every_served_job_recorded_once(
    tmp_path: Path, redis_server: str, client: redis.Redis
) -> None:
    env = {"EXAMLOPS_SECRET": SECRET, "EXAMLOPS_RECORDING__RECLAIM_IDLE_S": "2"}
    settings = Settings(home=tmp_path, redis={"url": redis_server}, secret=SECRET, token=TOKEN)  # type: ignore[arg-type]  # pydantic coerces
    upgrade_database(settings)
    known_token(settings, TOKEN)
    with StandIn() as serving:
        doomed, doomed_log = start_bridge_process(tmp_path, redis_server, serving.port, 64, env)
        survivor = None
        try:
            await until(lambda: "recording child" in doomed_log.read_text(errors="replace"), 30)
            child = int(doomed_log.read_text().split("recording child ")[1].split()[0])
            await until(lambda: priorities(child) == {19}, 30)
            os.kill(child, signal.SIGSTOP)  # the doomed bridge answers, its records are not written
            jobs = [f"job-{i}" for i in range(40)]
            async with bus_client(settings) as bus:
                replies = await asyncio.gather(*(bus.request(ADDRESS, PAYLOAD, 20, job_id=j) for j in jobs))
            assert [r["error"] for r in replies] == [None] * len(jobs)
            assert SnapshotStream(client).read("JPCP") == [] and served_events(client) == []
            os.killpg(doomed.pid, signal.SIGKILL)  # the bridge and its (stopped) child
            doomed.wait()
            survivor, _ = start_bridge_process(tmp_path, redis_server, serving.port, 64, env)
            await until(lambda: client.xlen(RECORDS_STREAM) == 0, 60)
        finally:
            for proc in (doomed, survivor):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(30)
    assert replies_per_job(redis_server, bus.reply_stream) == Counter(jobs)
    assert Counter(s.job_id for s in SnapshotStream(client).read("JPCP")) == Counter(jobs)
    assert Counter(e["job_id"] for e in served_events(client)) == Counter(jobs)
    assert verify(client, SECRET.encode(), None).ok
