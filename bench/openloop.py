"""Open-loop HTTP load: requests sent at the times a Poisson process draws, whether or not earlier ones were
answered (what a fleet of independent callers does; a closed loop would slow down with the server and hide
its overload).

Each request goes out on an idle keep-alive connection, or a new one when none is idle (up to
``max_connections``; beyond that it counts as not sent). A request not answered within its ``wait_s``
is given up (its connection closed) and recorded with status 0. Raw asyncio streams, as ``loadgen``,
so that the client costs little of the machine it shares with the server.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import orjson
from loadgen import header_lines


@dataclass(slots=True)
class Sent:
    """One request of the load and what became of it."""

    kind: str
    budget_ms: float
    sent_at: float
    latency_ms: float = float("nan")
    status: int = 0
    """0: no answer within the wait (given up), or never sent (``sent`` False)."""
    refused: str | None = None
    sent: bool = True


@dataclass
class _Pool:
    host: str
    port: int
    max_connections: int
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)
    open: int = 0


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> tuple[int, bytes]:
    writer.write(request)
    status_line = await reader.readline()
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    body = await reader.readexactly(length)
    return (int(status_line.split()[1]) if status_line else 0), body


async def _one(pool: _Pool, request: bytes, record: Sent, wait_s: float) -> None:
    if pool.idle:
        reader, writer = pool.idle.pop()
    elif pool.open < pool.max_connections:
        pool.open += 1
        try:
            reader, writer = await asyncio.open_connection(pool.host, pool.port)
        except OSError:
            pool.open -= 1
            record.sent = False
            return
    else:
        record.sent = False
        return
    started = time.perf_counter()
    try:
        async with asyncio.timeout(wait_s):
            status, body = await _exchange(reader, writer, request)
    except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
        record.latency_ms = (time.perf_counter() - started) * 1000
        writer.close()
        pool.open -= 1
        return
    record.latency_ms = (time.perf_counter() - started) * 1000
    record.status = status
    if status == 503:
        try:
            refused = orjson.loads(body).get("refused")
        except (orjson.JSONDecodeError, AttributeError):
            refused = None
        record.refused = refused if isinstance(refused, str) else None
    pool.idle.append((reader, writer))


async def open_loop(
    url: str,
    rate: float,
    seconds: float,
    pick: Callable[[random.Random], tuple[str, float, bytes]],
    *,
    headers: Mapping[str, str] | None = None,
    max_connections: int = 1024,
    grace_s: float = 1.0,
    seed: int = 1,
) -> list[Sent]:
    """Send requests at Poisson arrivals of ``rate`` per second for ``seconds``; wait for the last answers.

    ``pick(rng)`` gives each request's (kind, budget in ms, body); a request waits at most its budget plus
    ``grace_s`` for its answer. Returns every request, in sending order.
    """
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    lines = header_lines(headers or {})
    pool = _Pool(host, port, max_connections)
    rng = random.Random(seed)
    records: list[Sent] = []
    tasks: list[asyncio.Task[None]] = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    at = start
    while True:
        at += rng.expovariate(rate)
        if at - start > seconds:
            break
        delay = at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        kind, budget_ms, body = pick(rng)
        head = f"POST {parts.path} HTTP/1.1\r\nHost: {host}:{port}\r\n{lines}Content-Length: {len(body)}\r\n\r\n"
        record = Sent(kind, budget_ms, loop.time() - start)
        records.append(record)
        tasks.append(loop.create_task(_one(pool, head.encode() + body, record, budget_ms / 1000 + grace_s)))
    await asyncio.gather(*tasks)
    for _, writer in pool.idle:
        writer.close()
    return records
