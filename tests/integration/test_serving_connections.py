"""Slow, idle and surplus connections against the real serving process (uvicorn on a free port).

The limits are set short through the settings so that every test ends in seconds: headers within 1 s,
a body within 1.5 s, 1 s of keep-alive, at most 24 open connections. No model is needed: the routes read
their body before they ask whether the hot set is loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from examlops.api.schemas import ErrorReply
from tests.integration.servers import ServingProcess

ERROR_KEYS = set(ErrorReply.model_fields)
"""Every error body has every field of ``ErrorReply``, set or null."""

pytestmark = [pytest.mark.integration]

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.5
KEEP_ALIVE_S = 1
MAX_CONNECTIONS = 24
CLOSED_WITHIN_S = 4.0
"""Each deadline plus generous slack for a busy two-core machine; the bug held connections for minutes."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServingProcess]:
    proc = ServingProcess(
        tmp_path_factory.mktemp("edges"),
        env={
            "EXAMLOPS_SERVING__HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
            "EXAMLOPS_SERVING__BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
            "EXAMLOPS_SERVING__KEEP_ALIVE_S": str(KEEP_ALIVE_S),
            "EXAMLOPS_SERVING__MAX_CONNECTIONS": str(MAX_CONNECTIONS),
            "EXAMLOPS_PREDICT__WORKERS": "1",
        },
    )
    try:
        wait_alive(proc)
        yield proc
    finally:
        proc.stop()


async def read_until_closed(reader: asyncio.StreamReader, limit_s: float = CLOSED_WITHIN_S) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took; TimeoutError if it never does."""
    start = time.monotonic()
    data = b""
    async with asyncio.timeout(limit_s):
        while chunk := await reader.read(65536):
            data += chunk
    return data, time.monotonic() - start


async def connect(server: ServingProcess) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.port)


def error_body(response: bytes) -> dict[str, object]:
    _, _, body = response.partition(b"\r\n\r\n")
    data: dict[str, object] = json.loads(body)
    assert set(data) == ERROR_KEYS
    return data


def post_head(server: ServingProcess) -> bytes:
    """The start of a POST to the bus's route with the admin token: past authentication, to the body."""
    return (
        b"POST /infer-pipeline/infer HTTP/1.1\r\nhost: serving\r\nauthorization: Bearer %s\r\n" % server.token.encode()
    )


async def first_bytes(reader: asyncio.StreamReader, within_s: float = 0.5) -> bytes | None:
    """What the server sends first within ``within_s`` (b"" if it closed), None if it sent nothing."""
    try:
        async with asyncio.timeout(within_s):
            return await reader.read(65536)
    except TimeoutError:
        return None


def wait_alive(proc: ServingProcess, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{proc.url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, proc.log_tail()
        time.sleep(0.2)


@contextlib.contextmanager
def open_files_limit(limit: int) -> Iterator[None]:
    """Children started inside inherit a soft open-files limit of ``limit``; ours is restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def trickle(writer: asyncio.StreamWriter, data: bytes, every_s: float) -> None:
    """Send ``data`` a byte at a time until it is sent or the server closes the connection."""
    for byte in data:
        writer.write(bytes([byte]))
        try:
            await writer.drain()
        except ConnectionError:
            return
        await asyncio.sleep(every_s)


async def test_connections_that_never_send_a_byte_are_closed_after_the_header_deadline(
    server: ServingProcess,
) -> None:
    connections = [await connect(server) for _ in range(20)]
    results = await asyncio.gather(*(read_until_closed(reader) for reader, _ in connections))
    for data, took in results:
        assert data == b""  # nothing was asked, nothing is answered
        assert took < CLOSED_WITHIN_S
    for _, writer in connections:
        writer.close()


async def test_headers_sent_a_byte_at_a_time_get_a_408_and_the_connection_closed(server: ServingProcess) -> None:
    head = b"POST /infer-pipeline/infer HTTP/1.1\r\nhost: serving\r\nx-slow: " + b"a" * 200 + b"\r\n\r\n"

    async def slowloris() -> tuple[bytes, float]:
        reader, writer = await connect(server)
        sending = asyncio.create_task(trickle(writer, head, 0.2))
        try:
            return await read_until_closed(reader)
        finally:
            sending.cancel()
            writer.close()

    results = await asyncio.gather(*(slowloris() for _ in range(10)))
    for data, took in results:
        assert data.startswith(b"HTTP/1.1 408 "), data[:100]
        assert error_body(data)["code"] == "request_timeout"
        assert took < CLOSED_WITHIN_S


async def test_a_body_trickled_a_byte_at_a_time_is_cut_off_after_the_body_deadline(server: ServingProcess) -> None:
    reader, writer = await connect(server)
    writer.write(post_head(server) + b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n")
    sending = asyncio.create_task(trickle(writer, b" " * 1000, 0.2))
    try:
        data, took = await read_until_closed(reader, BODY_TIMEOUT_S + CLOSED_WITHIN_S)
    finally:
        sending.cancel()
        writer.close()
    assert data.startswith(b"HTTP/1.1 408 "), data[:100]
    assert error_body(data)["code"] == "request_timeout"
    assert took < BODY_TIMEOUT_S + CLOSED_WITHIN_S


async def test_an_idle_keep_alive_connection_is_closed_after_the_keep_alive(server: ServingProcess) -> None:
    reader, writer = await connect(server)
    writer.write(b"GET /healthz HTTP/1.1\r\nhost: serving\r\n\r\n")
    await writer.drain()
    data, took = await read_until_closed(reader)
    writer.close()
    assert data.startswith(b"HTTP/1.1 200 ")
    assert KEEP_ALIVE_S * 0.5 < took < KEEP_ALIVE_S + CLOSED_WITHIN_S


async def test_a_413_on_a_keep_alive_connection_closes_it(server: ServingProcess) -> None:
    reader, writer = await connect(server)
    writer.write(
        post_head(server) + b"content-type: application/json\r\ncontent-length: 10000000\r\n\r\n" + b" " * 1000
    )
    await writer.drain()
    data, _ = await read_until_closed(reader, 1.0)  # well before any deadline: the 413 itself closes it
    writer.close()
    assert data.startswith(b"HTTP/1.1 413 ")
    assert b"\r\nconnection: close\r\n" in data.lower()
    assert error_body(data)["code"] == "payload_too_large"


async def test_a_body_that_is_not_json_gets_a_415_with_our_body(server: ServingProcess) -> None:
    async with httpx.AsyncClient(base_url=server.url) as client:
        reply = await client.post(
            "/infer-pipeline/infer",
            content=b"model=JPCP",
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
    assert reply.status_code == 415
    assert reply.json()["code"] == "unsupported_media_type"


async def test_bytes_that_are_not_http_get_a_400_with_our_body(server: ServingProcess) -> None:
    reader, writer = await connect(server)
    writer.write(b"\x16\x03\x01 not http at all\r\n\r\n")
    await writer.drain()
    data, _ = await read_until_closed(reader, 2.0)
    writer.close()
    assert data.startswith(b"HTTP/1.1 400 ")
    assert error_body(data)["code"] == "bad_request"


async def test_connections_over_the_cap_get_a_fast_503_and_serving_recovers(server: ServingProcess) -> None:
    connections = [await connect(server) for _ in range(MAX_CONNECTIONS + 8)]
    answers = await asyncio.gather(*(first_bytes(reader) for reader, _ in connections))
    refused = 0
    for data in answers:
        if data is None:
            continue  # under the cap: waits for its request
        assert data.startswith(b"HTTP/1.1 503 "), data[:100]
        assert error_body(data)["code"] == "too_many_connections"
        refused += 1
    assert refused >= 8
    for _, writer in connections:
        writer.close()
    await asyncio.sleep(0.5)
    async with httpx.AsyncClient(base_url=server.url) as client:
        assert (await client.get("/healthz")).status_code == 200


async def test_a_client_gone_mid_body_costs_one_log_line_naming_the_route_and_bytes(server: ServingProcess) -> None:
    before = server.log_path.read_text(errors="replace")
    for _ in range(20):
        _, writer = await connect(server)
        writer.write(post_head(server) + b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n" + b" " * 100)
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()
        await writer.wait_closed()
    await asyncio.sleep(1.0)
    added = server.log_path.read_text(errors="replace")[len(before) :]
    # The load retry of this server's unseeded models logs on its own schedule (our upkeep, and MLflow's
    # client as it opens its store): not the connections' doing.
    lines = [line for line in added.splitlines() if "examlops.serving.upkeep" not in line and " mlflow." not in line]
    assert "Traceback" not in added
    disconnects = [line for line in lines if "client disconnected after 100 body bytes" in line]
    assert len(disconnects) == 20, added[-3000:]
    assert all("POST /infer-pipeline/infer" in line for line in disconnects)
    assert len(lines) == 20, added[-3000:]


async def test_idle_sockets_past_the_open_files_limit_are_refused_and_serving_recovers(tmp_path: Path) -> None:
    """The finding: with 300 open files allowed, 320 idle sockets made every new request fail."""
    with open_files_limit(300):
        proc = ServingProcess(
            tmp_path, env={"EXAMLOPS_SERVING__HEADER_TIMEOUT_S": "3", "EXAMLOPS_PREDICT__WORKERS": "1"}
        )
    connections: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        wait_alive(proc)
        connections = [await connect(proc) for _ in range(320)]
        answers = await asyncio.gather(*(first_bytes(reader) for reader, _ in connections))
        refused = [data for data in answers if data is not None]
        assert all(data.startswith(b"HTTP/1.1 503 ") for data in refused)
        assert len(refused) >= 320 - (300 - 128)  # the cap leaves 128 descriptors to serving itself
        # The idle ones hold their slots until the header deadline reaps them; then serving answers again.
        await asyncio.sleep(3.0)
        async with httpx.AsyncClient(base_url=proc.url) as client:
            for _ in range(50):
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get("/healthz", timeout=2)).status_code == 200:
                        break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("serving did not recover")
        assert "Too many open files" not in proc.log_path.read_text(errors="replace")
    finally:
        for _, writer in connections:
            writer.close()
        proc.stop()
