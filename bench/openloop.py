"""Open-loop HTTP load: requests sent at the times a Poisson process draws, whether or not earlier ones were
answered (what a fleet of independent callers does; a closed loop would slow down with the server and hide
its overload).

Each request goes out on an idle keep-alive connection, or a new one when none is idle (up to
``max_connections``; beyond that it counts as not sent). A connection idle longer than ``KEEPALIVE_S`` is
closed rather than reused, as HTTP clients do: below serving's ``serving.keep_alive_s`` (5 s), so a request
never goes out on a connection the server is closing for idleness (the keep-alive close race). A request not
answered within its ``wait_s`` is given up (its connection closed) and recorded with status 0. Raw asyncio
streams, as ``loadgen``, so that the client costs little of the machine it shares with the server.

Run as a script it is the load of ``tests/e2e/test_up_drain.py``, in a process of its own (so that it shares
no event loop with what watches the drain): every request as one JSON object in ``--out``, with the
``time.monotonic()`` (system-wide) at which it went on the wire and at which its answer came.

    python bench/openloop.py --url http://127.0.0.1:8000/infer-pipeline/infer --rate 800 --seconds 40 \
        --body body.json --header "Authorization: Bearer ..." --stop-when-refused --out sent.json
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import orjson
from loadgen import frozen_heap, header_lines


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
    wire_at: float = float("nan")
    """``time.monotonic()`` when the request was written to its connection; nan when it never got one."""
    answered_at: float = float("nan")
    """``time.monotonic()`` when its answer was read whole; nan when none came."""
    error: str = ""
    """The exception's class name when no answer came (a refused connection, a reset, a timeout)."""
    detail: str = ""
    """The start of the body of an answer other than 200."""


KEEPALIVE_S = 4.0
"""Seconds an idle connection is reused at most (the bridge's ``bus.keepalive_s`` too)."""


@dataclass
class _Pool:
    host: str
    port: int
    max_connections: int
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = field(default_factory=list)
    """Idle connections with the ``time.monotonic()`` they were last answered on, the newest last."""
    open: int = 0
    refused: bool = False
    """A new connection was refused (the server's listener is closed)."""


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> tuple[int, bytes]:
    writer.write(request)
    status_line = await reader.readline()
    if not status_line:  # closed before any answer (the keep-alive close race): the connection is spent
        raise asyncio.IncompleteReadError(b"", None)
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    body = await reader.readexactly(length)
    return int(status_line.split()[1]), body


def _reusable(pool: _Pool) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """The newest idle connection; those idle past ``KEEPALIVE_S`` are closed on the way."""
    now = time.monotonic()
    while pool.idle:
        reader, writer, last = pool.idle.pop()
        if now - last <= KEEPALIVE_S:
            return reader, writer
        writer.close()
        pool.open -= 1
    return None


async def _one(pool: _Pool, request: bytes, record: Sent, wait_s: float) -> None:
    if (reused := _reusable(pool)) is not None:
        reader, writer = reused
    elif pool.open < pool.max_connections:
        pool.open += 1
        try:
            reader, writer = await asyncio.open_connection(pool.host, pool.port)
        except OSError as exc:
            pool.open -= 1
            pool.refused = True
            record.sent, record.error = False, type(exc).__name__
            return
    else:
        record.sent, record.error = False, "no connection free"
        return
    started = time.perf_counter()
    record.wire_at = time.monotonic()
    try:
        async with asyncio.timeout(wait_s):
            status, body = await _exchange(reader, writer, request)
    except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
        record.latency_ms = (time.perf_counter() - started) * 1000
        record.error = type(exc).__name__
        writer.close()
        pool.open -= 1
        return
    record.answered_at = time.monotonic()
    record.latency_ms = (time.perf_counter() - started) * 1000
    record.status = status
    if status != 200:
        record.detail = body[:300].decode("utf-8", "replace")
    if status == 503:
        try:
            refused = orjson.loads(body).get("refused")
        except (orjson.JSONDecodeError, AttributeError):
            refused = None
        record.refused = refused if isinstance(refused, str) else None
    pool.idle.append((reader, writer, record.answered_at))


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
    stop_when_refused: bool = False,
    started: Callable[[], None] | None = None,
) -> list[Sent]:
    """Send requests at Poisson arrivals of ``rate`` per second for ``seconds``; wait for the last answers.

    ``pick(rng)`` gives each request's (kind, budget in ms, body); a request waits at most its budget plus
    ``grace_s`` for its answer. With ``stop_when_refused`` no request is sent after a new connection was
    refused (the server closed its listener). ``started()`` is called as the first request is sent. Returns
    every request, in sending order. The client's garbage collector leaves the objects that existed before
    the load alone (``loadgen.frozen_heap``).
    """
    with frozen_heap():
        return await _open_loop(
            url, rate, seconds, pick, headers, max_connections, grace_s, seed, stop_when_refused, started
        )


async def _open_loop(
    url: str,
    rate: float,
    seconds: float,
    pick: Callable[[random.Random], tuple[str, float, bytes]],
    headers: Mapping[str, str] | None,
    max_connections: int,
    grace_s: float,
    seed: int,
    stop_when_refused: bool,
    started: Callable[[], None] | None,
) -> list[Sent]:
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
        if stop_when_refused and pool.refused:
            break
        if started is not None and not records:
            started()
        kind, budget_ms, body = pick(rng)
        head = f"POST {parts.path} HTTP/1.1\r\nHost: {host}:{port}\r\n{lines}Content-Length: {len(body)}\r\n\r\n"
        record = Sent(kind, budget_ms, loop.time() - start)
        records.append(record)
        tasks.append(loop.create_task(_one(pool, head.encode() + body, record, budget_ms / 1000 + grace_s)))
    await asyncio.gather(*tasks)
    for _, writer, _ in pool.idle:
        writer.close()
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--body", type=Path, required=True, help="file holding every request's body")
    parser.add_argument("--header", action="append", default=[], help="'Name: value', repeatable")
    parser.add_argument("--wait", type=float, default=90.0, help="seconds a request waits for its answer")
    parser.add_argument("--max-connections", type=int, default=1024, help="beyond them a request is not sent")
    parser.add_argument("--stop-when-refused", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    body = args.body.read_bytes()
    headers = dict(tuple(part.strip() for part in h.split(":", 1)) for h in args.header)

    def announce() -> None:
        print("started", flush=True)  # the first request goes now

    records = asyncio.run(
        open_loop(
            args.url, args.rate, args.seconds, lambda _rng: ("post", args.wait * 1000, body),
            headers=headers, max_connections=args.max_connections, grace_s=0.0,
            stop_when_refused=args.stop_when_refused, started=announce,
        )
    )  # fmt: skip
    args.out.write_bytes(orjson.dumps([asdict(r) for r in records]))
    sys.exit(0)


if __name__ == "__main__":
    main()
