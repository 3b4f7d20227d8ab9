"""Bus round trip against direct HTTP, and the hop's HTTP transports against each other.

Starts a real redis-server, `exa serve start` and one `exa bridge start` per
client configuration (``--clients``) on a state folder with the demo models
(``.examlops/bench-bus`` by default), then for each concurrency sends the same
bounded count of JPCP requests along every path, in interleaved rounds (raw,
httpx, bus A, bus B, raw, httpx, ...) so that a slow spell of this shared
machine does not land on one path only:

- raw http: POST /infer-pipeline/infer on keep-alive connections (``loadgen``,
  a minimal asyncio client, so the client is not what is measured), with the
  state folder's admin token (``demo.auth_headers``);
- httpx <http>: the same POST through the bridge's own hop client
  (``bootstrap.hop_client``, pre-encoded body, the platform token of the
  state folder as the bridge sends it) over that transport: direct HTTP as a
  Python caller makes it, and what the bridge's hop costs alone;
- bus <http>: ``BusClient.request`` (the submit script, the bridge's
  XREADGROUP, its POST, the reply script, the client's XREAD), with that
  configuration's bridge on that transport (``EXAMLOPS_BUS__HTTP_CLIENT``). Each
  configuration has a Redis database of its own, so its bridge serves only
  its jobs; the others' bridges idle meanwhile.

The last table gives each path's req/s as a ratio to the first configuration's
(and each httpx path's to the first one's), per concurrency: compare clients
by these ratios within one run.

Every client runs on uvloop, as the bridge does. Printed per path: p50 and p99
over all rounds, the median round's req/s, and for the bus the CPU time each
process spent per job (bridge, serving with its pool workers, Redis, the
client), which is what bounds req/s when all of them share two cores, and
serving's mean batch (requests per feature-transformer batch, from its
``examlops_batch_size`` metric): a serving request costs less CPU in a larger
batch.

    .venv/bin/python bench/bus_vs_http.py [--requests 1000] [--rounds 3] [--concurrency 1 32] \
        [--clients aiohttp library]

Figures only: nothing here asserts anything. Target: the bus adds at most 2 ms at p50.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo import auth_headers, demo_state
from demo import bodies as demo_bodies
from loadgen import run_load
from procs import CpuMeter, quantile, start, stop, wait_until

from examlops.bootstrap import bus_client, hop_client
from examlops.bus.hop_http import JSON_HEADERS
from examlops.core.settings import BusSettings, HttpSettings, RedisSettings, Settings
from examlops.platform.redis_server import EmbeddedRedis

SERVING_PORT, REDIS_PORT = 18101, 18104
HTTP_CLIENTS = ("aiohttp", "library")


@dataclass
class Run:
    """One round of one path."""

    latencies: list[float]
    seconds: float
    errors: int
    cpu_ms: dict[str, float] = field(default_factory=dict)
    batch: float = 0.0
    """Serving's mean batch size (requests per feature-transformer batch) over the round."""


def batches(url: str) -> tuple[float, float]:
    """Serving's ``examlops_batch_size`` histogram so far: (sum of sizes, number of batches)."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    found = dict(re.findall(r"^examlops_batch_size_(sum|count) ([0-9.e+]+)$", text, re.MULTILINE))
    return float(found.get("sum", 0.0)), float(found.get("count", 0.0))


async def timed_workers(count: int, concurrency: int, call: Callable[[int], Coroutine[Any, Any, bool]]) -> Run:
    """``concurrency`` workers share ``count`` calls; ``call(i)`` returns True when the reply was an error."""
    latencies: list[float] = []
    errors = 0
    queue = list(range(count))

    async def worker() -> None:
        nonlocal errors
        while queue:
            i = queue.pop()
            began = time.perf_counter()
            failed = await call(i)
            latencies.append((time.perf_counter() - began) * 1000)
            errors += failed

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Run(latencies, time.perf_counter() - began, errors)


async def bus_load(settings: Settings, address: str, bodies: list[dict[str, object]], concurrency: int) -> Run:
    async with bus_client(settings) as client:
        for body in bodies[:50]:  # warm-up: connections, the script cache (and the bridge's start on round 1)
            await client.request(address, body, 60)

        async def call(i: int) -> bool:
            reply = await client.request(address, bodies[i], 30)
            return reply.get("error") is not None

        return await timed_workers(len(bodies), concurrency, call)


async def raw_http_load(url: str, bodies: list[dict[str, object]], concurrency: int, headers: dict[str, str]) -> Run:
    """Direct HTTP with ``loadgen`` (raw keep-alive sockets, ``headers`` on each): the server's own latency."""
    encoded = [json.dumps(b).encode() for b in bodies]
    await run_load(url, lambda i: encoded[i % len(encoded)], total=50, concurrency=1, headers=headers)
    # Bounded: at c=32 a loadgen connection was seen to wait forever for a reply; report that, not hang.
    load = run_load(
        url, lambda i: encoded[i], total=len(encoded), concurrency=concurrency, max_seconds=120, headers=headers
    )
    result = await asyncio.wait_for(load, 150)
    return Run(result.latencies_ms, result.seconds, result.errors)


async def httpx_load(home: Path, url: str, bodies: list[dict[str, object]], concurrency: int, transport: str) -> Run:
    """Direct HTTP with httpx, configured and called exactly as the bridge's hop is (``bus.hop``), with the
    platform token of the state folder ``home`` (``hop_headers``)."""
    encoded = [json.dumps(b, separators=(",", ":")).encode() for b in bodies]
    http = HttpSettings(connect_timeout_s=30, read_timeout_s=30)
    bus = BusSettings(concurrency=concurrency, http_client=transport)
    async with hop_client(Settings(home=home, http=http, bus=bus)) as client:
        for body in encoded[:50]:
            await client.post(url, content=body, headers=JSON_HEADERS)

        async def call(i: int) -> bool:
            reply = await client.post(url, content=encoded[i], headers=JSON_HEADERS)
            return reply.status_code != 200

        return await timed_workers(len(bodies), concurrency, call)


def pooled(runs: list[Run]) -> dict[str, Any]:
    """One row for the rounds of one path: quantiles over all their latencies, the median round's req/s."""
    every = [v for run in runs for v in run.latencies]
    row: dict[str, Any] = {
        "p50": statistics.median(every),
        "p99": quantile(every, 0.99),
        "rps": statistics.median(len(run.latencies) / run.seconds for run in runs),
        "errors": sum(run.errors for run in runs),
    }
    if runs[0].cpu_ms:
        row["cpu_ms_per_job"] = {k: round(statistics.median(r.cpu_ms[k] for r in runs), 3) for k in runs[0].cpu_ms}
    row["serving_batch"] = round(statistics.median(run.batch for run in runs), 2)
    return row


def print_ratios(table: list[tuple[int, dict[str, dict[str, Any]]]], first: str) -> None:
    """Each bus path's req/s as a ratio to the first configuration's, each httpx path's to the first's."""
    print(f"req/s relative to {first} (1.00 = the same; below 1 = slower)")
    for concurrency, figures in table:
        base = figures[first]["rps"]
        ratios = "  ".join(f"{p} {row['rps'] / base:.2f}" for p, row in figures.items() if p.startswith("bus"))
        print(f"{concurrency:>3} {ratios}")
        direct = [path for path in figures if path.startswith("httpx")]
        if len(direct) > 1:
            ratios = "  ".join(f"{p} {figures[p]['rps'] / figures[direct[0]]['rps']:.2f}" for p in direct)
            print(f"{concurrency:>3} {ratios}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000, help="requests per path per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument(
        "--clients",
        choices=HTTP_CLIENTS,
        nargs="+",
        default=[BusSettings().http_client],
        help="the hop's HTTP clients (EXAMLOPS_BUS__HTTP_CLIENT), each with its own bridge; the first is the "
        "ratios' base (default: the settings' default)",
    )
    parser.add_argument("--home", type=Path, default=Path(".examlops/bench-bus"))
    args = parser.parse_args()
    clients: list[str] = list(dict.fromkeys(args.clients))
    if len(clients) > 15:
        parser.error("at most 15 configurations (one Redis database each)")

    home = args.home.resolve()
    # An empty Redis each run: the last run's append-only file (GBs of done keys and replies) takes longer to
    # load than the start-up waits, and the figures should not depend on what earlier runs left.
    shutil.rmtree(home / "redis", ignore_errors=True)
    base, catalog = demo_state(home)
    headers = auth_headers(base)
    spec = catalog.get("JPCP")
    bodies = demo_bodies(spec.embedding_dim, args.requests, seed=7)

    redis_server = EmbeddedRedis(home / "redis", REDIS_PORT)
    redis_server.start()
    redis_server_pid = redis_server.process.pid
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXAMLOPS_")}
    env |= {"EXAMLOPS_HOME": str(home), "EXAMLOPS_REDIS__URL": redis_server.url}
    env["EXAMLOPS_SERVING__PORT"] = str(SERVING_PORT)
    serving = start([sys.executable, "-m", "examlops.cli.main", "serve", "start"], env, home / "serving.log")
    bridge_code = "from examlops.cli.bus import bridge_app; bridge_app()"
    bridges: dict[str, Any] = {}
    settings: dict[str, Settings] = {}
    for db, http_client in enumerate(clients, start=1):
        name = f"bus {http_client}"
        url = redis_server.url.rsplit("/", 1)[0] + f"/{db}"
        bus = BusSettings(http_client=http_client)
        settings[name] = Settings(home=home, redis=RedisSettings(url=url), bus=bus)
        bridge_env = env | {"EXAMLOPS_REDIS__URL": url, "EXAMLOPS_BUS__HTTP_CLIENT": http_client}
        log = home / f"bridge-{http_client}.log"
        bridges[name] = start([sys.executable, "-c", bridge_code, "start", "--log-level", "warning"], bridge_env, log)
    url = f"http://127.0.0.1:{SERVING_PORT}"
    try:
        wait_until(lambda: httpx.get(f"{url}/readyz", timeout=2).status_code == 200, "serving")
        assert redis_server_pid is not None
        infer_url, named = f"{url}/infer-pipeline/infer", [b | {"model": "JPCP"} for b in bodies]
        address = str(spec.seanerbus_uuid)
        loads: dict[str, Callable[[int], Coroutine[Any, Any, Run]]] = {
            "raw http": lambda c: raw_http_load(infer_url, named, c, headers)
        }
        for transport in clients:
            loads[f"httpx {transport}"] = lambda c, t=transport: httpx_load(home, infer_url, named, c, t)  # type: ignore[misc]
        for name in bridges:
            loads[name] = lambda c, s=settings[name]: bus_load(s, address, bodies, c)  # type: ignore[misc]
        meters = {
            path: CpuMeter(
                {"serving": serving.pid, "redis": redis_server_pid}
                | ({"bridge": bridges[path].pid} if path in bridges else {})
            )
            for path in loads
        }
        table: list[tuple[int, dict[str, dict[str, Any]]]] = []
        for concurrency in args.concurrency:
            runs: dict[str, list[Run]] = {path: [] for path in loads}
            for round_no in range(args.rounds):
                for path, load in loads.items():
                    meter = meters[path]
                    before, cpu_before, batched = meter.read(), time.process_time(), batches(url)
                    run = uvloop.run(load(concurrency))
                    after, cpu_after = meter.read(), time.process_time()
                    sizes, count = (now - then for now, then in zip(batches(url), batched, strict=True))
                    run.batch = sizes / count if count else 0.0
                    jobs = len(run.latencies) + 50  # with the warm-up
                    run.cpu_ms = {k: (after[k] - before[k]) * 1000 / jobs for k in after}
                    run.cpu_ms["client"] = (cpu_after - cpu_before) * 1000 / jobs
                    runs[path].append(run)
                print(f"c={concurrency} round {round_no + 1}/{args.rounds} done", flush=True)
            figures = {path: pooled(runs[path]) for path in loads}
            table.append((concurrency, figures))
            print(json.dumps({"concurrency": concurrency, **figures}), flush=True)

        print(f"\n{args.requests} requests per path and round, {args.rounds} interleaved rounds, JPCP,")
        print(f"one serving process, one bridge per configuration, all clients on uvloop ({os.cpu_count()} cores)\n")
        width = max(len(path) for path in loads)
        heads = f"{'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'errors':>6} {'batch':>6}"
        print(f"{'c':>3} {'path':<{width}} {heads}  cpu ms per job")
        for concurrency, figures in table:
            for path, row in figures.items():
                cpu = "  ".join(f"{k} {v:.2f}" for k, v in row["cpu_ms_per_job"].items())
                print(
                    f"{concurrency:>3} {path:<{width}} {row['p50']:>8.2f} {row['p99']:>8.2f} "
                    f"{row['rps']:>8.0f} {row['errors']:>6} {row['serving_batch']:>6.1f}  {cpu}"
                )
            first = next(iter(bridges))
            for baseline in ("raw http", f"httpx {clients[0]}"):
                added = figures[first]["p50"] - figures[baseline]["p50"]
                print(f"{concurrency:>3} {first} adds {added:.2f} ms at p50 over {baseline}")
            print()
        print_ratios(table, next(iter(bridges)))
    finally:
        for bridge in bridges.values():
            stop(bridge)
        stop(serving)
        redis_server.stop()


if __name__ == "__main__":
    main()
