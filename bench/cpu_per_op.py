"""CPU per operation of the bus path's and the trace path's hot pieces, each against what it replaced, in one run.

Load on this shared machine moves req/s by tens of percent; the CPU time one operation takes moves far
less. Each section alternates the two variants over ``--rounds`` rounds and prints the median CPU time
(``time.thread_time`` of this process's main thread) per operation:

- ``hop``: the bridge's hop client (``bus.hop_http.http_client``: ``HopClient``, no cookies) against a
  plain ``httpx.AsyncClient`` with the same settings, transport (``bootstrap.clients.hop_transport``) and
  headers (a bearer token, as ``bootstrap.clients.hop_headers`` gives), posting a JPCP body with a bus job's
  headers at ``--concurrency`` to a fixed-reply HTTP server in a child process (its reply's headers as
  uvicorn's; the server's CPU is not counted);
- ``pack``: packing a bus job's two Redis commands (the client's submit, the bridge's reply script) by the
  connections of ``adapters.redis.connect_async`` (hiredis) and of redis-py's own asyncio client;
- ``record``: building a ``TraceRecord`` by keyword (the request path) and from a row (the trace writer
  child), against a frozen dataclass of the same fields.

    PYTHONPATH=. .venv/bin/python bench/cpu_per_op.py [--rounds 5] [--requests 3000] [--concurrency 32]

Figures only: nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo import bodies as demo_bodies

from examlops.adapters.redis import connect_async
from examlops.bootstrap.clients import hop_transport
from examlops.bus import replies, wire
from examlops.bus.hop_http import http_client, trace_headers
from examlops.core.settings import Settings
from examlops.tracing import TraceRecord

REPLY = b'{"model":"JPCP","alias":"Production","version":"1","run_id":"r","prediction":3.25,"error":null,"job_id":"j"}'
SERVER = r"""
import asyncio, sys
body = sys.argv[2].encode()
head = (b"HTTP/1.1 200 OK\r\ndate: Wed, 02 Dec 2026 10:00:00 GMT\r\nserver: uvicorn\r\n"
        b"content-type: application/json\r\nx-examlops-trace: 0123456789abcdef0123456789abcdef\r\n"
        b"content-length: %d\r\n\r\n" % len(body))
class Fixed(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buffer = transport, b""
    def data_received(self, data):
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            lines = self.buffer[:end].lower().split(b"\r\n")
            length = next((int(h.split(b":")[1]) for h in lines if h.startswith(b"content-length:")), 0)
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length:]
            self.transport.write(head + body)
async def main():
    server = await asyncio.get_running_loop().create_server(Fixed, "127.0.0.1", int(sys.argv[1]))
    await server.serve_forever()
asyncio.run(main())
"""


def alternate(variants: dict[str, Callable[[], float]], rounds: int) -> None:
    """Run each variant once per round, in turn; print each one's median CPU µs per operation."""
    spent: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, measure in variants.items():
            spent[name].append(measure())
    for name, values in spent.items():
        print(f"  {name:<44} {statistics.median(values):8.2f} µs  ({', '.join(f'{v:.1f}' for v in values)})")


def hop_section(rounds: int, requests: int, concurrency: int) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port), REPLY.decode()])
    try:
        time.sleep(1.0)
        home = Path(tempfile.mkdtemp(prefix="cpu-per-op-"))
        settings = Settings(home=home)
        timeout = httpx.Timeout(settings.http.read_timeout_s, connect=settings.http.connect_timeout_s)
        url = httpx.URL(f"http://127.0.0.1:{port}/infer-pipeline/infer")
        embedding = demo_bodies(384, 1, seed=7)[0]["embedding"]
        body = json.dumps({"embedding": embedding, "node_count": 12, "model": "JPCP"}).encode()
        headers = trace_headers("0123456789abcdef0123456789abcdef", "admin")

        token = {"Authorization": "Bearer exa_benchkey_" + "s" * 43}

        def plain() -> httpx.AsyncClient:
            transport = hop_transport(settings)
            return httpx.AsyncClient(timeout=timeout, transport=transport, headers=token, trust_env=False)

        def hop() -> httpx.AsyncClient:
            return http_client(settings.http, hop_transport(settings), token)

        def measure(make: Callable[[], httpx.AsyncClient]) -> Callable[[], float]:
            async def posts(client: httpx.AsyncClient, count: int) -> None:
                left = list(range(count))

                async def worker() -> None:
                    while left:
                        left.pop()
                        response = await client.post(url, content=body, headers=headers)
                        response.raise_for_status()

                await asyncio.gather(*(worker() for _ in range(concurrency)))

            async def run() -> float:
                async with make() as client:
                    await posts(client, 200)
                    began = time.thread_time()
                    await posts(client, requests)
                    return (time.thread_time() - began) * 1e6 / requests

            return lambda: uvloop.run(run())

        print(f"hop: client CPU per request, {requests} POSTs at c={concurrency} (aiohttp transport by default)")
        alternate({"httpx.AsyncClient (before)": measure(plain), "HopClient, no cookies (after)": measure(hop)}, rounds)
    finally:
        server.kill()
        server.wait()


def pack_section(rounds: int) -> None:
    payload = demo_bodies(384, 1, seed=7)[0]
    key, address, now = b"k" * 32, str(uuid.uuid4()), time.time()
    job = wire.encode_job(
        "keyid", key, address=address, job_id=uuid.uuid4().hex, reply_to=wire.replies_stream("c"),
        deadline=now + 30, payload=payload, submitted=now,
    )  # fmt: skip
    submit: list[Any] = ["EVALSHA", "a" * 40, 2, wire.jobs_stream(address), wire.ADDRESSES_KEY, address, 100_000]
    for name, value in job.items():
        submit += [name, value]
    body = {"model": "JPCP", "alias": "Production", "version": "1", "prediction": 3.25, "error": None}
    finish: list[Any] = ["EVALSHA", "b" * 40, 6, "s", "d", "r", "dead", "records", "dropped", "bridges", "1-1", 600]
    finish += [10_000, 600, 10_000, "", "token:1", '["a","JPCP","admin",12,1.0,0.9,0.01,0.05]', 1000]
    for name, value in replies.reply_fields("keyid", key, "j" * 32, body | {"job_id": "j" * 32}, 200).items():
        finish += [name, value]
    url = "redis://127.0.0.1:1/0"
    theirs = aioredis.Redis.from_url(url, decode_responses=True, encoding_errors="replace")
    connections = {
        "redis-py's asyncio packer (before)": theirs.connection_pool.make_connection(),
        "hiredis, adapters.redis (after)": connect_async(url).connection_pool.make_connection(),
    }
    for what, args in (("the client's submit", submit), ("the bridge's reply script", finish)):

        def measure(connection: Any, args: list[Any] = args) -> Callable[[], float]:
            def run() -> float:
                began = time.thread_time()
                for _ in range(5000):
                    connection.pack_command(*args)
                return (time.thread_time() - began) * 1e6 / 5000

            return run

        print(f"pack: CPU per command, {what} ({len(args)} arguments)")
        alternate({name: measure(connection) for name, connection in connections.items()}, rounds)


def record_section(rounds: int) -> None:
    names = [(f.name, f.type, dataclasses.field(default=f.default)) for f in dataclasses.fields(TraceRecord)]
    frozen: Any = dataclasses.make_dataclass("FrozenTraceRecord", names, frozen=True, slots=True)
    values: dict[str, Any] = {
        "trace_id": "a" * 32, "at": time.time(), "channel": "http", "outcome": "answered", "model": "JPCP",
        "alias": "Production", "version": "1", "identity": "admin", "used_ms": 3.2, "node": "bench",
        "batch_id": "b" * 16, "batch_size": 12, "queue_wait_ms": 1.0, "predict_ms": 0.5, "status": 200,
    }  # fmt: skip
    row = tuple(values.get(f.name, f.default) for f in dataclasses.fields(TraceRecord))

    def by_keyword(cls: Any) -> Callable[[], float]:
        def run() -> float:
            began = time.thread_time()
            for _ in range(20_000):
                cls(**values)
            return (time.thread_time() - began) * 1e6 / 20_000

        return run

    def by_row(cls: Any) -> Callable[[], float]:
        def run() -> float:
            began = time.thread_time()
            for _ in range(20_000):
                cls(*row)
            return (time.thread_time() - began) * 1e6 / 20_000

        return run

    print("record: CPU per TraceRecord, by keyword (the request path) and from a row (the trace writer child)")
    alternate(
        {
            "frozen dataclass, by keyword (before)": by_keyword(frozen),
            "TraceRecord, by keyword (after)": by_keyword(TraceRecord),
            "frozen dataclass, from a row (before)": by_row(frozen),
            "TraceRecord, from a row (after)": by_row(TraceRecord),
        },
        rounds,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=3000, help="POSTs per round of the hop section")
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    import examlops

    print(f"checkout: {Path(examlops.__file__).parent.parent}")
    hop_section(args.rounds, args.requests, args.concurrency)
    pack_section(args.rounds)
    record_section(args.rounds)


if __name__ == "__main__":
    main()
