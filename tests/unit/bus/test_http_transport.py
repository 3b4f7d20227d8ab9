"""The bridge's keep-alive transport against loopback servers that answer in every way HTTP/1.1 allows, and fail."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import httpx
import pytest

from examlops.bus.http_transport import KeepAliveTransport
from tests.unit.bus.loopback import reply, server


def client(**transport: float) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=KeepAliveTransport(**transport), timeout=httpx.Timeout(5.0), trust_env=False)  # type: ignore[arg-type]


async def test_requests_reuse_one_kept_alive_connection_and_carry_their_body() -> None:
    async with server(lambda body: reply(body[::-1])) as (url, counts, _), client() as http:
        for i in range(5):
            response = await http.post(url, content=b"abc%d" % i, headers={"content-type": "application/json"})
            assert response.status_code == 200 and response.content == b"%dcba" % i
            assert response.headers["content-type"] == "application/json"
    assert counts == [5]


async def test_concurrent_requests_open_connections_up_to_the_limit() -> None:
    async with server(lambda body: reply(body)) as (url, counts, _), client(max_connections=3) as http:
        bodies = [b"%d" % i for i in range(12)]
        responses = await asyncio.gather(*(http.post(url, content=body) for body in bodies))
    assert [r.content for r in responses] == bodies
    assert 1 <= len(counts) <= 3 and sum(counts) == 12


async def test_a_chunked_reply_is_read_whole() -> None:
    chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    async with server(lambda body: chunked) as (url, counts, _), client() as http:
        assert (await http.post(url, content=b"x")).content == b"abcde"
        assert (await http.post(url, content=b"x")).content == b"abcde"
    assert counts == [2]


async def test_a_reply_that_ends_with_its_connection_is_read_whole_and_not_reused() -> None:
    async with (
        server(lambda body: b"HTTP/1.1 200 OK\r\n\r\n{}", close_after=True) as (url, counts, _),
        client() as http,
    ):
        assert (await http.post(url, content=b"x")).content == b"{}"
        assert (await http.post(url, content=b"x")).content == b"{}"
    assert counts == [1, 1]


async def test_connection_close_is_honoured() -> None:
    async with server(lambda body: reply(b"{}", extra=b"connection: close\r\n")) as (url, counts, _), client() as http:
        for _ in range(3):
            assert (await http.post(url, content=b"x")).status_code == 200
    assert counts == [1, 1, 1]


async def test_a_connection_the_server_closed_while_idle_is_not_used_again() -> None:
    async with server(lambda body: reply(b"{}"), close_after=True) as (url, counts, _), client() as http:
        assert (await http.post(url, content=b"x")).status_code == 200
        await asyncio.sleep(0.05)  # the server's close reaches the idle connection
        assert (await http.post(url, content=b"x")).status_code == 200
    assert counts == [1, 1]


async def test_an_idle_connection_past_its_expiry_is_dropped() -> None:
    async with server(lambda body: reply(b"{}")) as (url, counts, _), client(keepalive_expiry=0.05) as http:
        await http.post(url, content=b"x")
        await asyncio.sleep(0.1)
        await http.post(url, content=b"x")
    assert counts == [1, 1]


async def test_a_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with client() as http:
        with pytest.raises(httpx.ConnectError) as caught:
            await http.post(f"http://127.0.0.1:{port}/", content=b"x")
    assert isinstance(caught.value.__cause__, OSError)


async def test_a_silent_server_is_a_read_timeout_and_its_connection_is_closed() -> None:
    async with server(lambda body: None) as (url, _, _), client() as http:
        with pytest.raises(httpx.ReadTimeout) as caught:
            await http.post(url, content=b"x", timeout=0.2)
        assert isinstance(caught.value.__cause__, TimeoutError)
        await asyncio.sleep(0.05)
        assert http._transport._idle == {} or not any(http._transport._idle.values())  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "raw",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * 70_000 + b"\r\ncontent-length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{}",  # then the connection closes: a short body
    ],
    ids=["garbage", "headers-too-long", "short-body"],
)
async def test_a_reply_that_is_not_whole_http_is_a_remote_protocol_error(raw: bytes) -> None:
    async with server(lambda body: raw, close_after=True) as (url, _, _), client() as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.post(url, content=b"x")


async def test_a_cancelled_request_closes_its_connection_and_the_next_one_works() -> None:
    answers: list[bytes | None] = [None, reply(b"second")]
    async with server(lambda body: answers.pop(0)) as (url, counts, _), client() as http:
        task = asyncio.create_task(http.post(url, content=b"x"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await http.post(url, content=b"x")).content == b"second"
    assert counts == [1, 1]


async def test_a_scheme_other_than_http_is_refused() -> None:
    async with client() as http:
        with pytest.raises(httpx.UnsupportedProtocol):
            await http.post("ftp://127.0.0.1/", content=b"x")


async def test_a_reply_split_across_many_writes_is_read_whole_and_the_connection_reused() -> None:
    whole = reply(b'{"prediction":0.5}')
    answers = [tuple(whole[i : i + 7] for i in range(0, len(whole), 7)), reply(b"again")]
    async with server(lambda body: answers.pop(0)) as (url, counts, _), client() as http:
        assert (await http.post(url, content=b"x")).json() == {"prediction": 0.5}
        assert (await http.post(url, content=b"x")).content == b"again"
    assert counts == [2]


async def test_bytes_after_a_whole_reply_keep_the_reply_and_retire_the_connection() -> None:
    async with (
        server(lambda body: reply(b"first") + b"HTTP/1.1 500 X\r\nx: y\r\n") as (url, counts, _),
        client() as http,
    ):
        response = await http.post(url, content=b"x")
        assert (response.status_code, response.content) == (200, b"first")
        assert (await http.post(url, content=b"x")).content == b"first"  # a new connection's first reply
    assert counts == [1, 1]


async def test_an_interim_reply_is_skipped_for_the_final_one() -> None:
    interim_then_final = (b"HTTP/1.1 100 Continue\r\n\r\n", reply(b"final"))
    async with server(lambda body: interim_then_final) as (url, _, _), client() as http:
        response = await http.post(url, content=b"x")
    assert (response.status_code, response.content) == (200, b"final")


async def test_a_body_cut_by_a_reset_is_an_error_not_a_reply() -> None:
    async with server(lambda body: b'HTTP/1.1 200 OK\r\n\r\n{"a"', reset=True) as (url, _, _), client() as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.post(url, content=b"x")


async def test_waiting_for_a_connection_is_bounded_by_the_pool_timeout_and_the_pool_recovers() -> None:
    answers: list[bytes | None] = [None, reply(b"ok")]
    async with server(lambda body: answers.pop(0)) as (url, _, _), client(max_connections=1) as http:
        first = asyncio.create_task(http.post(url, content=b"x"))
        await asyncio.sleep(0.05)
        with pytest.raises(httpx.PoolTimeout):
            await http.post(url, content=b"x", timeout=httpx.Timeout(5.0, pool=0.1))
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        assert (await http.post(url, content=b"x", timeout=httpx.Timeout(5.0, pool=1.0))).content == b"ok"


@pytest.mark.parametrize("headers", [{"x-a": "1\r\nInjected: 1"}, {"x-a": "1\nx"}, {"x-a": "a\0b"}])
async def test_a_header_that_would_split_the_request_is_refused_before_sending(headers: dict[str, str]) -> None:
    async with server(lambda body: reply(b"{}")) as (url, counts, _), client() as http:
        with pytest.raises(httpx.LocalProtocolError):
            await http.post(url, content=b"x", headers=headers)
    assert counts == []
