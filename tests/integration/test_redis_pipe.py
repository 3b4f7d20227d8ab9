"""The bus's lean pipelined Redis client against a real redis-server: what only it does (one connection shared
in order, its own timeouts and reconnects). What both Redis clients do is in ``test_bus_store.py``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from examlops.adapters.redis import LuaScript
from examlops.bus import redis_pipe
from examlops.bus.redis_pipe import PipelinedRedis
from examlops.platform.redis_server import EmbeddedRedis
from tests.integration.conftest import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def url(client: redis.Redis, redis_server: str) -> Iterator[str]:
    client.flushall()
    yield redis_server


@contextlib.asynccontextmanager
async def pipe_to(url: str) -> AsyncIterator[PipelinedRedis]:
    pipe = PipelinedRedis.from_url(url)
    try:
        yield pipe
    finally:
        await pipe.aclose()


async def test_concurrent_commands_share_one_connection_and_each_gets_its_own_reply(url: str) -> None:
    async with pipe_to(url) as pipe:
        counts = await asyncio.gather(*(pipe.execute("INCR", "n") for _ in range(300)))
        assert sorted(counts) == list(range(1, 301))
        await pipe.execute("SET", "a", "x")
        assert await pipe.execute("MGET", "a", "missing", "n") == ["x", None, "300"]
        clients = await pipe.execute("CLIENT", "LIST")
    assert clients.count("cmd=client") == 1  # the 300 INCRs and the rest went over this one connection


async def test_an_error_reply_raises_and_the_connection_stays_usable(url: str) -> None:
    async with pipe_to(url) as pipe:
        await pipe.execute("SET", "text", "abc")
        results = await asyncio.gather(
            pipe.execute("INCR", "text"), pipe.execute("GET", "text"), return_exceptions=True
        )
        assert isinstance(results[0], ResponseError) and "not an integer" in str(results[0])
        assert results[1] == "abc"


async def test_a_script_the_server_forgot_is_loaded_and_run(url: str, client: redis.Redis) -> None:
    script = LuaScript("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    async with pipe_to(url) as pipe:
        assert await pipe.evalsha(script, ["k"], [5]) == 5
        client.script_flush()
        assert await pipe.evalsha(script, ["k"], [2]) == 7


async def test_the_clients_database_is_selected(redis_server: str, client: redis.Redis) -> None:
    client.flushall()
    async with pipe_to(redis_server.rstrip("/0") + "/3") as pipe:
        await pipe.execute("SET", "in-three", "1")
    with redis.Redis.from_url(redis_server.rstrip("/0") + "/3") as three:
        assert three.get("in-three") == b"1"
    assert client.get("in-three") is None


async def test_a_slow_reply_times_out_closes_the_connection_and_the_next_command_reconnects(url: str) -> None:
    async with pipe_to(url) as pipe:
        pipe.timeout_s = 0.2
        slow = asyncio.ensure_future(pipe.execute("DEBUG", "SLEEP", "0.6"))
        await asyncio.sleep(0.05)
        behind = asyncio.ensure_future(pipe.execute("PING"))
        with pytest.raises(RedisTimeoutError):
            await slow
        with pytest.raises(RedisConnectionError):
            await behind  # its reply would have come on a connection whose order can't be trusted any more
        await asyncio.sleep(0.6)
        assert await pipe.execute("PING") == "PONG"


async def test_redis_down_is_a_connection_error_after_retries_and_a_restart_is_reconnected(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis", free_port())
    server.start()
    try:
        async with pipe_to(server.url) as pipe:
            pipe.retries = 2
            await pipe.execute("SET", "kept", "1")
            server.stop()
            with pytest.raises(RedisConnectionError):
                await pipe.execute("GET", "kept")
            server.start()
            assert await pipe.execute("GET", "kept") == "1"  # the AOF kept it; the connection is a new one
    finally:
        server.stop()


async def test_a_server_that_speaks_garbage_fails_the_command_with_a_connection_error() -> None:
    handled = asyncio.Event()

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read(100)
            writer.write(b"?this is not RESP\r\n")
            await writer.drain()
            await reader.read(100)  # until the client hangs up
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            handled.set()

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pipe = PipelinedRedis("127.0.0.1", port, timeout_s=5)
    try:
        with pytest.raises(RedisConnectionError, match="not RESP"):
            await pipe.execute("PING")
    finally:
        await pipe.aclose()
        await asyncio.wait_for(handled.wait(), 5)
        server.close()
        await server.wait_closed()


async def test_only_plain_tcp_urls_are_spoken() -> None:
    pipe = PipelinedRedis.from_url("redis://u:secret@example:6390/2")
    assert (pipe.host, pipe.port, pipe.db, pipe.username, pipe.password) == ("example", 6390, 2, "u", "secret")
    for url in ("unix:///tmp/nowhere.sock", "rediss://127.0.0.1:1/0"):
        assert not redis_pipe.speaks(url)
        with pytest.raises(ValueError, match="plain TCP"):
            PipelinedRedis.from_url(url)


async def test_blocking_commands_go_on_a_second_connection(url: str) -> None:
    async with pipe_to(url) as pipe:
        waiting = asyncio.ensure_future(pipe.wait("BLPOP", "nothing", 2))
        await asyncio.sleep(0.1)
        assert await asyncio.wait_for(pipe.execute("PING"), 1) == "PONG"
        assert not waiting.done()
        await pipe.aclose()
        with pytest.raises(RedisConnectionError):
            await waiting  # closing the pipe closes both connections


async def test_callers_that_arrive_while_connecting_share_the_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    opened = 0

    async def failing_open(self: PipelinedRedis) -> redis_pipe._Protocol:
        nonlocal opened
        opened += 1
        await asyncio.sleep(0.1)
        raise redis_pipe._NotConnected() from RedisConnectionError("refused")

    monkeypatch.setattr(PipelinedRedis, "_open", failing_open)
    pipe = PipelinedRedis("127.0.0.1", 1, retries=1)
    results = await asyncio.gather(*(pipe.execute("PING") for _ in range(10)), return_exceptions=True)
    assert all(isinstance(r, RedisConnectionError) for r in results)
    assert opened == 2  # one attempt and one retry, each shared by the ten callers


async def test_a_connection_that_went_quiet_is_pinged_first_and_replaced_when_it_does_not_answer(url: str) -> None:
    async with pipe_to(url) as pipe:
        assert await pipe.execute("SET", "k", "v") is not None
        dead = pipe._protocol
        assert dead is not None and dead.transport is not None
        dead.transport.write = lambda data: None  # type: ignore[method-assign]  # the network eats every byte
        pipe.timeout_s, pipe.idle_check_s = 0.3, 0.0
        assert await pipe.execute("GET", "k") == "v"  # the PING timed out, nothing of ours was lost
        assert pipe._protocol is not dead


async def test_a_refused_password_is_an_authentication_error_and_a_closed_pipe_refuses_commands(url: str) -> None:
    host, port = url.split("//")[1].split("/")[0].split(":")
    pipe = PipelinedRedis(host, int(port), password="not-configured")
    with pytest.raises(AuthenticationError):
        await pipe.execute("PING")
    async with pipe_to(url) as open_pipe:
        assert await open_pipe.execute("PING") == "PONG"
        await open_pipe.aclose()
        with pytest.raises(RedisConnectionError, match="closed"):
            await open_pipe.execute("PING")


async def test_a_reply_that_is_not_utf8_fails_its_own_caller_only(url: str, client: redis.Redis) -> None:
    client.set("binary", b"\xff\xfe")
    async with pipe_to(url) as pipe:
        results = await asyncio.gather(pipe.execute("GET", "binary"), pipe.execute("PING"), return_exceptions=True)
        assert isinstance(results[0], ResponseError) and "UTF-8" in str(results[0])
        assert results[1] == "PONG"


async def test_a_command_for_a_connection_that_closed_before_it_was_sent_goes_on_a_new_one(url: str) -> None:
    async with pipe_to(url) as pipe:
        assert await pipe.execute("PING") == "PONG"
        first = pipe._protocol
        assert first is not None and first.transport is not None
        first.transport.close()  # closing, but connection_lost has not run yet
        assert await pipe.execute("PING") == "PONG"
        assert pipe._protocol is not first
