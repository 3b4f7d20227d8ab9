"""The bus client against a Redis that accepts connections and never answers: the request's timeout bounds
the whole call, and `exa bus send --timeout` exits 3 within it.

The operator audit's case: with Redis SIGSTOPped, `exa bus send ... --timeout 2` hung for more than 300 s,
until SIGCONT. redis-py retries a new connection's handshake inside each retry of a command, so against a
Redis that never answers one command takes minutes (``examlops.adapters.redis.connect_async``). Here: a
black hole (``FaultProxy``) in front of the shared redis-server, and a redis-server of its own SIGSTOPped.
``BOUND_S`` is generous on purpose: these assert that the call ends, not how fast; the exact bound is
``tests/unit/bus/test_client_deadline.py``'s, on a virtual clock.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from typer.testing import CliRunner

from examlops.adapters.redis import RedisPyCommands
from examlops.bus import scripts, wire
from examlops.bus.client import BusClient
from examlops.cli.main import app
from examlops.core.errors import StoreUnavailable
from examlops.platform.redis_server import EmbeddedRedis
from tests.faults.proxy import FaultProxy
from tests.ports import free_port

pytestmark = pytest.mark.timeout(120)

ADDRESS = "6c1b2d0e-0f8a-4c2b-9a37-1f2e3d4c5b6a"
PAYLOAD = {"embedding": [0.1, 0.2], "node_count": 3}
KEY_ID, KEY = "k1", b"k" * 32
TIMEOUT_S = 2.0
BOUND_S = TIMEOUT_S + 5.0
"""The most a call may take: its timeout, plus a generous margin for a busy machine."""
TOKEN = "exa_0123abcd4567ef89_" + "s" * 43
runner = CliRunner()


@pytest.fixture
def black_hole(redis_url: str) -> Iterator[FaultProxy]:
    """The shared redis-server behind a proxy that accepts every connection and holds it, unanswered."""
    upstream = urlsplit(redis_url)
    assert upstream.hostname is not None and upstream.port is not None
    with FaultProxy(upstream.hostname, upstream.port) as proxy:
        proxy.blackhole = True
        yield proxy


@pytest.fixture
def stopped_redis(tmp_path: Path) -> Iterator[str]:
    """A redis-server of its own, SIGSTOPped: connections are accepted by the kernel and nothing answers."""
    server = EmbeddedRedis(tmp_path / "redis", free_port())
    server.start()
    pid = server.process.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        yield server.url
    finally:
        os.kill(pid, signal.SIGCONT)
        server.stop()


async def test_a_request_to_a_redis_that_holds_every_connection_raises_store_unavailable_within_its_timeout(
    black_hole: FaultProxy,
) -> None:
    client = BusClient(RedisPyCommands(f"redis://127.0.0.1:{black_hole.port}/0"), KEY_ID, KEY)
    start = time.monotonic()
    try:
        with pytest.raises(StoreUnavailable, match="did not take job"):
            await client.request(ADDRESS, PAYLOAD, TIMEOUT_S)
    finally:
        await client.close()
    assert time.monotonic() - start < BOUND_S
    assert black_hole.stats.accepted >= 1  # it was reached, and held


async def test_a_job_redis_takes_after_its_request_gave_up_is_already_past_its_deadline(
    black_hole: FaultProxy, redis_url: str
) -> None:
    with redis.Redis.from_url(redis_url) as admin:
        admin.script_load(scripts.SUBMIT_SCRIPT)  # as on a Redis that took jobs before: the EVALSHA alone runs it
    # The bus's clock injected (this machine's wall clock, Redis's too here): the first command is the job.
    client = BusClient(RedisPyCommands(f"redis://127.0.0.1:{black_hole.port}/0"), KEY_ID, KEY, clock=time.time)
    try:
        with pytest.raises(StoreUnavailable):
            await client.request(ADDRESS, PAYLOAD, TIMEOUT_S, job_id="late-1")
        black_hole.blackhole = False  # what it held reaches Redis now, as a SIGCONTed Redis reads its sockets
        with redis.Redis.from_url(redis_url, decode_responses=True) as admin:
            entries: list[tuple[str, dict[str, str]]] = []
            give_up = time.monotonic() + 30
            while not entries and time.monotonic() < give_up:
                entries = admin.xrange(wire.jobs_stream(ADDRESS))
                await asyncio.sleep(0.05)  # the client's held command goes on, on this loop
            seconds, micros = admin.time()
    finally:
        await client.close()
    [(_, job)] = entries
    assert job["job_id"] == "late-1"
    assert float(job["deadline"]) < seconds + micros / 1e6  # a bridge reading it now finds it expired


def test_bus_send_against_a_sigstopped_redis_exits_3_within_its_timeout(
    stopped_redis: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXAMLOPS_HOME", str(tmp_path))
    monkeypatch.setenv("EXAMLOPS_REDIS__URL", stopped_redis)
    monkeypatch.setenv("EXAMLOPS_TOKEN", TOKEN)
    start = time.monotonic()
    argv = ["bus", "send", "JPCP", "--random", "--node-count", "12", "--timeout", str(TIMEOUT_S)]
    result = runner.invoke(app, argv)
    assert time.monotonic() - start < BOUND_S
    assert result.exit_code == 3, result.output
    assert "Redis did not take job" in " ".join(result.output.split())


def test_bus_send_that_no_bridge_answers_exits_3_within_its_timeout(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXAMLOPS_HOME", str(tmp_path))
    monkeypatch.setenv("EXAMLOPS_REDIS__URL", redis_url)
    monkeypatch.setenv("EXAMLOPS_TOKEN", TOKEN)
    start = time.monotonic()
    result = runner.invoke(app, ["bus", "send", "JPCP", "--random", "--node-count", "12", "--timeout", "1"])
    assert time.monotonic() - start < 1.0 + BOUND_S - TIMEOUT_S
    assert result.exit_code == 3, result.output
    assert "no reply to job" in " ".join(result.output.split())
