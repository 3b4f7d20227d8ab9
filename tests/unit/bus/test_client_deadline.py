"""The bus client's timeout bounds the whole request: reading the bus's clock, the submission and the wait,
against a Redis port that takes some commands and never answers the others (a paused Redis).

On looptime's virtual clock: every wait below is exact and instant, so "within the timeout" is asserted
exactly. The same bound over real sockets, a black hole and a SIGSTOPped redis-server:
``tests/faults/test_bus_client_faults.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from examlops.adapters.redis import Arg, LuaScript
from examlops.bus import sync_client as sync_module
from examlops.bus import wire
from examlops.bus.client import BusClient
from examlops.bus.sync_client import SyncBusClient
from examlops.core.errors import DeadlineExceeded, StoreUnavailable

pytestmark = pytest.mark.looptime

ADDRESS = "6c1b2d0e-0f8a-4c2b-9a37-1f2e3d4c5b6a"
PAYLOAD = {"embedding": [0.1, 0.2], "node_count": 3}
KEY_ID, KEY = "k1", b"k" * 32


class SilentRedis:
    """A ``RedisCommands`` port that answers only the commands in ``answers`` and holds every other one
    forever, as a Redis that accepts connections and never answers does; it records what it was sent."""

    def __init__(self, answers: Sequence[str] = ()) -> None:
        self.answers = set(answers)
        self.submitted: list[dict[str, str]] = []
        self.closed = False

    async def _hold(self) -> Any:
        await asyncio.get_running_loop().create_future()  # never set: only a cancellation ends it

    async def execute(self, *args: Arg) -> Any:
        if args[0] == "TIME" and "TIME" in self.answers:
            now = time.time()
            return [str(int(now)), "0"]
        return await self._hold()

    async def wait(self, *args: Arg) -> Any:
        return await self._hold()  # the reader's XREAD BLOCK

    async def evalsha(self, script: LuaScript, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        if "SUBMIT" not in self.answers:
            return await self._hold()
        flat = [str(a) for a in args[2:]]
        self.submitted.append(dict(zip(flat[::2], flat[1::2], strict=True)))
        return "1-0"

    async def aclose(self) -> None:
        self.closed = True


def bus_client(redis: SilentRedis, *, clock: Any = None) -> BusClient:
    return BusClient(redis, KEY_ID, KEY, clock=clock)


async def test_a_request_whose_clock_read_redis_never_answers_raises_store_unavailable_at_its_timeout() -> None:
    loop = asyncio.get_running_loop()
    redis = SilentRedis()
    client = bus_client(redis)  # its RedisClock reads TIME first, on the silent port
    start = loop.time()
    with pytest.raises(StoreUnavailable, match="did not take job j1 within 30 s"):
        await client.request(ADDRESS, PAYLOAD, 30.0, job_id="j1")
    assert loop.time() - start == pytest.approx(30.0)
    await client.close()
    assert redis.closed and loop.time() - start == pytest.approx(30.0)  # a held reader is not waited for


async def test_a_request_whose_submission_redis_never_answers_raises_store_unavailable_at_its_timeout() -> None:
    loop = asyncio.get_running_loop()
    client = bus_client(SilentRedis(["TIME"]))
    start = loop.time()
    with pytest.raises(StoreUnavailable, match="may still reach its stream; it carries its deadline"):
        await client.request(ADDRESS, PAYLOAD, 12.5, job_id="j2")
    assert loop.time() - start == pytest.approx(12.5)
    await client.close()


async def test_a_job_redis_took_but_no_bridge_answered_is_deadline_exceeded_and_carries_that_deadline() -> None:
    loop = asyncio.get_running_loop()
    redis = SilentRedis(["TIME", "SUBMIT"])
    client = bus_client(redis, clock=loop.time)  # the bus's clock: the loop's, so the wire's deadline is exact
    start = loop.time()
    with pytest.raises(DeadlineExceeded, match="no reply to job j3 within 7 s"):
        await client.request(ADDRESS, PAYLOAD, 7.0, job_id="j3")
    assert loop.time() - start == pytest.approx(7.0)
    [job] = redis.submitted
    assert float(job["deadline"]) == pytest.approx(start + 7.0)  # no bridge serves it after the wait ended
    assert job["job_id"] == "j3" and job["reply_to"] == wire.replies_stream(client.client_id)
    await client.close()


def test_the_sync_client_raises_what_the_async_one_does_within_the_timeout() -> None:
    with SyncBusClient(bus_client(SilentRedis())) as client:
        start = time.monotonic()
        with pytest.raises(StoreUnavailable, match="did not take job"):
            client.request(ADDRESS, PAYLOAD, 0.3)
        assert time.monotonic() - start < 0.3 + sync_module.SYNC_MARGIN_S


class StuckLoop:
    """A ``BusClient`` whose request blocks its event loop's thread (a bug): only the backstop ends the wait."""

    unverified_replies = 0

    def __init__(self, blocks_s: float) -> None:
        self.blocks_s = blocks_s

    async def request(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        time.sleep(self.blocks_s)  # noqa: ASYNC251  # the point: a loop that does not come back
        return {}

    async def close(self) -> None:
        pass


def test_the_sync_client_gives_up_after_its_margin_when_the_event_loop_is_stuck(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sync_module, "SYNC_MARGIN_S", 0.2)
    with SyncBusClient(StuckLoop(blocks_s=1.0)) as client:  # type: ignore[arg-type]  # a fake BusClient
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded, match=r"event loop did not return within 0\.3 s"):
            client.request(ADDRESS, PAYLOAD, 0.1)
        assert time.monotonic() - start < 1.0
