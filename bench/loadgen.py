"""A minimal keep-alive HTTP/1.1 load generator on asyncio streams.

A client built on httpx saturates a core near 250 req/s (NOTES.md), which
would measure the client instead of the server; this one writes raw requests
on persistent connections and reads replies by Content-Length.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class LoadResult:
    sent: int
    errors: int
    seconds: float
    latencies_ms: list[float]
    statuses: dict[int, int]

    @property
    def rps(self) -> float:
        return self.sent / self.seconds if self.seconds else 0.0

    def quantile(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies_ms) if self.latencies_ms else float("nan")

    @property
    def p99(self) -> float:
        return self.quantile(0.99)


async def _connection(
    host: str,
    port: int,
    path: str,
    body_for: Callable[[int], bytes],
    counter: list[int],
    total: int,
    result: dict[str, object],
    deadline: float,
    headers: str,
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    latencies: list[float] = result["latencies"]  # type: ignore[assignment]
    statuses: dict[int, int] = result["statuses"]  # type: ignore[assignment]
    try:
        while counter[0] < total and time.perf_counter() < deadline:
            i = counter[0]
            counter[0] += 1
            body = body_for(i)
            head = (
                f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{headers}Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            started = time.perf_counter()
            writer.write(head + body)
            status_line = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            await reader.readexactly(length)
            latencies.append((time.perf_counter() - started) * 1000)
            status = int(status_line.split()[1]) if status_line else 0
            statuses[status] = statuses.get(status, 0) + 1
    finally:
        writer.close()


def header_lines(headers: Mapping[str, str]) -> str:
    """``headers`` as ``Name: value`` lines, each ending CRLF, led by ``Content-Type: application/json`` unless
    they name one; ``ValueError`` for an empty name, or a name or value that would split a line."""
    for name, value in headers.items():
        if not name or ":" in name or any(c in name + value for c in "\r\n"):
            raise ValueError(f"header {name[:40]!r} cannot go on one line")
    if not any(name.lower() == "content-type" for name in headers):
        headers = {"Content-Type": "application/json", **headers}
    return "".join(f"{name}: {value}\r\n" for name, value in headers.items())


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Collect once, then keep the garbage collector off what already exists (``gc.freeze``) while the load
    runs: a bench process that imported the platform and trained its models holds millions of objects, and
    a full collection of them stalled the client 200-300 ms, which its records counted as the server's
    latency (bench/RESULTS.md, 2026-12-06)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


async def run_load(
    url: str,
    body_for: Callable[[int], bytes],
    *,
    total: int,
    concurrency: int,
    max_seconds: float = 60.0,
    headers: Mapping[str, str] | None = None,
) -> LoadResult:
    """Send ``total`` POSTs over ``concurrency`` keep-alive connections (bounded by ``max_seconds``).

    ``headers`` are extra header lines on every request (e.g. ``{"Authorization": "Bearer <token>"}``);
    ``Content-Type: application/json`` unless they name a ``Content-Type`` of their own. A name or value
    that would split a line is refused (``ValueError``) before anything is sent."""
    lines = header_lines(headers or {})
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    counter = [0]
    result: dict[str, object] = {"latencies": [], "statuses": {}}
    started = time.perf_counter()
    deadline = started + max_seconds
    tasks = [
        _connection(host, port, parts.path or "/", body_for, counter, total, result, deadline, lines)
        for _ in range(concurrency)
    ]
    with frozen_heap():
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    seconds = time.perf_counter() - started
    statuses: dict[int, int] = result["statuses"]  # type: ignore[assignment]
    latencies: list[float] = result["latencies"]  # type: ignore[assignment]
    broken = sum(1 for o in outcomes if isinstance(o, BaseException))
    errors = sum(n for s, n in statuses.items() if s != 200) + broken
    return LoadResult(len(latencies), errors, seconds, latencies, statuses)
