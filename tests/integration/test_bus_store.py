"""The bus store against a real redis-server, over the redis-py adapter ``bootstrap.bus_redis`` builds."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import redis
from redis.exceptions import ResponseError

from examlops.bootstrap.clients import bus_redis
from examlops.bus import wire
from examlops.bus.store import BusStore
from examlops.core.errors import StoreUnavailable
from examlops.core.settings import RedisSettings, Settings
from examlops.platform.redis_server import EmbeddedRedis
from tests.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ADDRESS = str(uuid.UUID(int=7))
STREAM = wire.jobs_stream(ADDRESS)
DIGEST = "0123456789abcdef"
StoreFor = Callable[[str], BusStore]


def settings_for(url: str) -> Settings:
    return Settings(redis=RedisSettings(url=url))


@pytest.fixture
async def store_for() -> AsyncIterator[StoreFor]:
    """Stores for a URL; closed at teardown."""
    stores: list[BusStore] = []

    def build(url: str) -> BusStore:
        stores.append(BusStore(bus_redis(settings_for(url)), reply_ttl_s=60))
        return stores[-1]

    yield build
    for store in stores:
        await store.aclose()


@pytest.fixture
def store(store_for: StoreFor, client: redis.Redis, redis_server: str) -> BusStore:
    client.script_flush()
    return store_for(redis_server)


async def test_a_submitted_job_is_read_once_by_the_group_and_its_address_noted(
    store: BusStore, client: redis.Redis
) -> None:
    await store.ensure_groups([STREAM])
    await store.ensure_groups([STREAM])  # an existing group is kept
    entry_id = await store.submit(ADDRESS, {"job_id": "j-1", "payload": "{}"})
    assert client.smembers(wire.ADDRESSES_KEY) == {ADDRESS}
    assert await store.read("b-1", [STREAM], 10, None) == [(STREAM, entry_id, {"job_id": "j-1", "payload": "{}"})]
    assert await store.read("b-2", [STREAM], 10, None) == []
    assert await store.read("b-2", [STREAM], 10, 50) == []  # waited 50 ms for a new one


async def test_a_blocking_read_returns_a_job_submitted_while_it_waits(store: BusStore) -> None:
    await store.ensure_groups([STREAM])
    waiting = asyncio.create_task(store.read("b-1", [STREAM], 10, 5000))
    await asyncio.sleep(0.1)
    entry_id = await store.submit(ADDRESS, {"job_id": "j-2"})
    assert await asyncio.wait_for(waiting, 5) == [(STREAM, entry_id, {"job_id": "j-2"})]


async def test_a_blocking_read_holds_up_no_other_command(store: BusStore) -> None:
    reply_stream = wire.replies_stream("idle-client")
    waiting = asyncio.create_task(store.replies(reply_stream, "0-0", 3000))
    await asyncio.sleep(0.1)
    assert await asyncio.wait_for(store.done_among(["nobody"]), 1) == {}
    assert not waiting.done()
    assert await waiting == []


async def test_a_group_on_a_key_that_is_no_stream_is_an_error(store: BusStore, client: redis.Redis) -> None:
    client.set("not-a-stream", "x")
    with pytest.raises(ResponseError):
        await store.ensure_groups(["not-a-stream"])


async def test_finish_replies_once_per_job_and_acks_and_deletes_the_entry(store: BusStore, client: redis.Redis) -> None:
    await store.ensure_groups([STREAM])
    first_id, second_id = await store.submit(ADDRESS, {"n": "1"}), await store.submit(ADDRESS, {"n": "2"})
    await store.read("b-1", [STREAM], 10, None)
    reply_to = wire.replies_stream("c-1")
    reply = {"job_id": "job-a", "body": "{}"}
    once = {"done_id": "job-a", "reply_to": reply_to, "reply": reply, "digest": DIGEST}
    assert await store.finish(STREAM, first_id, **once, token="t-1")
    assert await store.finish(STREAM, first_id, **once, token="t-1")
    assert not await store.finish(STREAM, second_id, **once, token="t-2")
    done = await store.done_among(["job-a", "job-b"])
    assert list(done) == ["job-a"] and await store.done_among([]) == {}
    [(reply_id, fields)] = await store.replies(reply_to, "0-0", 10)
    assert fields == reply
    assert wire.reply_location(done["job-a"]) == (DIGEST, reply_to, reply_id)  # what a retry's copy finds
    assert done["job-a"] == f"t-1\n{DIGEST}\nc-1\n{reply_id}"  # short: the stream is the client id's
    assert client.xlen(STREAM) == 0 and client.xpending(STREAM, wire.GROUP)["pending"] == 0
    assert 0 < client.ttl(reply_to) <= 60


async def test_resend_gives_a_copy_the_job_ids_one_reply_marked_resent_only_for_its_key_id(
    store: BusStore, client: redis.Redis
) -> None:
    await store.ensure_groups([STREAM])
    first = await store.submit(ADDRESS, {"n": "1"})
    copies = [await store.submit(ADDRESS, {"n": str(n)}) for n in (2, 3, 4, 5, 6)]
    await store.read("b-1", [STREAM], 10, None)
    reply_to, retry_to = wire.replies_stream("c-1"), wire.replies_stream("c-2")
    reply = {"job_id": "job-a", "status": "200", "body": "{}", "key": "k-1", "sig": "s"}
    assert await store.finish(STREAM, first, done_id="job-a", reply_to=reply_to, reply=reply, digest=DIGEST)
    done = wire.reply_location((await store.done_among(["job-a"]))["job-a"])
    assert await store.resend(STREAM, copies[0], reply=done, reply_to=retry_to, key_id="k-1")
    assert not await store.resend(STREAM, copies[1], reply=done, reply_to=retry_to, key_id="another-key")
    assert not await store.resend(STREAM, copies[4], reply=None, reply_to=retry_to, key_id="k-1")  # only acked
    client.xack(STREAM, wire.GROUP, copies[3])  # answered already (by a bridge that reclaimed it): no resend
    assert not await store.resend(STREAM, copies[3], reply=done, reply_to=retry_to, key_id="k-1")
    client.delete(reply_to)  # expired: nothing left to resend
    assert not await store.resend(STREAM, copies[2], reply=done, reply_to=retry_to, key_id="k-1")
    assert [fields for _id, fields in await store.replies(retry_to, "0-0", 10)] == [{**reply, "resent": "1"}]
    assert client.xlen(STREAM) == 0 and client.xpending(STREAM, wire.GROUP)["pending"] == 0
    assert 0 < client.ttl(retry_to) <= 60


async def test_finish_dead_letters_a_refused_job(store: BusStore, client: redis.Redis) -> None:
    await store.ensure_groups([STREAM])
    entry_id = await store.submit(ADDRESS, {"n": "1"})
    dead = {"reason": "bad_signature"}
    assert await store.finish(STREAM, entry_id, done_id="job-d", reply_to=None, reply={}, dead=dead)
    [(_id, letter)] = client.xrange(wire.DEAD_STREAM)
    assert letter == {"entry": entry_id, "job": '{"reason":"bad_signature"}'}


async def test_a_job_a_dead_consumer_holds_is_reclaimed_with_its_deliveries_counted(store: BusStore) -> None:
    await store.ensure_groups([STREAM])
    ids = [await store.submit(ADDRESS, {"n": str(n)}) for n in range(3)]
    await store.read("dead-bridge", [STREAM], 10, None)
    claimed = await store.autoclaim(STREAM, "live-bridge", 0, 10)
    assert [(entry_id, fields) for _stream, entry_id, fields in claimed] == [
        (entry_id, {"n": str(n)}) for n, entry_id in enumerate(ids)
    ]
    assert await store.deliveries(STREAM, ids[0]) == 2
    assert await store.deliveries(STREAM, "0-1") == 0
    assert await store.autoclaim(STREAM, "live-bridge", 60_000, 10) == []


async def test_heartbeats_tell_which_addresses_are_served(store: BusStore) -> None:
    await store.heartbeat(["a-1", "a-2"], 100.0)
    await store.heartbeat([], 200.0)
    await store.heartbeat(["a-2"], 130.0)
    assert await store.served_elsewhere(140.0, 20.0) == {"a-2"}
    assert await store.served_elsewhere(140.0, 60.0) == {"a-1", "a-2"}


async def test_job_streams_found_in_the_keyspace_are_noted_and_empty_ones_forgotten(
    store: BusStore, client: redis.Redis
) -> None:
    direct = str(uuid.UUID(int=8))
    client.xadd(wire.jobs_stream(direct), {"n": "1"})  # XADDed directly: not in the addresses set
    for n in range(1500):  # more keys than one SCAN step
        client.set(f"filler:{n}", "x")
    await store.submit(ADDRESS, {"n": "1"})
    assert await store.note_existing_streams() == 2
    assert await store.job_streams() == sorted([STREAM, wire.jobs_stream(direct)])
    assert not await store.forget_if_empty(STREAM)
    client.delete(STREAM)
    assert await store.forget_if_empty(STREAM)
    assert await store.job_streams() == [wire.jobs_stream(direct)]


async def test_the_append_only_setting_is_read(store: BusStore, client: redis.Redis) -> None:
    assert await store.appendonly() == client.config_get("appendonly")["appendonly"]


async def test_scripts_a_restarted_redis_forgot_are_sent_again(store: BusStore, client: redis.Redis) -> None:
    await store.submit(ADDRESS, {"n": "1"})
    client.script_flush()
    await store.submit(ADDRESS, {"n": "2"})
    assert client.xlen(STREAM) == 2


async def test_redis_down_is_store_unavailable_and_a_restart_is_reconnected(
    store_for: StoreFor, tmp_path: Path
) -> None:
    server = EmbeddedRedis(tmp_path / "redis", free_port())
    server.start()
    try:
        store = store_for(server.url)
        await store.submit(ADDRESS, {"n": "1"})
        server.stop()
        with pytest.raises(StoreUnavailable, match="submitting a job"):
            await store.submit(ADDRESS, {"n": "2"})
        server.start()
        await store.submit(ADDRESS, {"n": "3"})
        assert await store.job_streams() == [STREAM]
    finally:
        server.stop()
