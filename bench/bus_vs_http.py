"""Bus round trip against direct HTTP: what the Redis bus and the bridge add to a prediction.

Starts a real redis-server, `exa serve start` and one `exa bridge start` on a
state folder with the demo models (``.examlops/bench-bus`` by default), then
for each concurrency sends the same bounded count of JPCP requests three ways,
in interleaved rounds (raw, httpx, bus, raw, httpx, bus, ...) so that a slow
spell of this shared machine does not land on one path only:

- raw http: POST /infer-pipeline/infer on keep-alive connections (``loadgen``,
  a minimal asyncio client, so the client is not what is measured);
- httpx: the same POST through the bridge's own httpx client and call
  (``hop.http_client``, pre-encoded body): direct HTTP as a Python
  caller makes it, and what the bridge's hop costs alone;
- bus: ``BusClient.request`` (the submit script, the bridge's XREADGROUP, its
  POST over httpx, the reply script, the client's XREAD).

Every client runs on uvloop, as the bridge does. Printed per path: p50 and p99
over all rounds, the median round's req/s, and for the bus the CPU time each
process spent per job (bridge, serving with its pool workers, Redis, the
client), which is what bounds req/s when all of them share two cores, and
serving's mean batch (requests per feature-transformer batch, from its
``examlops_batch_size`` metric): a serving request costs less CPU in a larger
batch.

    .venv/bin/python bench/bus_vs_http.py [--requests 1000] [--rounds 3] [--concurrency 1 32]

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
import numpy as np
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import run_load
from procs import CpuMeter, quantile, start, stop, wait_until

from examlops.bootstrap import upgrade_database
from examlops.bus.client import BusClient
from examlops.bus.hop import JSON_HEADERS, http_client
from examlops.core.settings import BusSettings, HttpSettings, RedisSettings, Settings
from examlops.platform.redis_server import EmbeddedRedis
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo

SERVING_PORT, REDIS_PORT = 18101, 18104
PATHS = ("raw http", "httpx", "bus")


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
    async with BusClient.from_settings(settings, caller="bench") as client:
        for body in bodies[:50]:  # warm-up: connections, the script cache
            await client.request(address, body, 30)

        async def call(i: int) -> bool:
            reply = await client.request(address, bodies[i], 30)
            return reply.get("error") is not None

        return await timed_workers(len(bodies), concurrency, call)


async def raw_http_load(url: str, bodies: list[dict[str, object]], concurrency: int) -> Run:
    """Direct HTTP with ``loadgen`` (raw keep-alive sockets): the server's own latency."""
    encoded = [json.dumps(b).encode() for b in bodies]
    await run_load(url, lambda i: encoded[i % len(encoded)], total=50, concurrency=1)
    # Bounded: at c=32 a loadgen connection was seen to wait forever for a reply; report that, not hang.
    load = run_load(url, lambda i: encoded[i], total=len(encoded), concurrency=concurrency, max_seconds=120)
    result = await asyncio.wait_for(load, 150)
    return Run(result.latencies_ms, result.seconds, result.errors)


async def httpx_load(url: str, bodies: list[dict[str, object]], concurrency: int) -> Run:
    """Direct HTTP with httpx, configured and called exactly as the bridge's hop is (``bus.hop``)."""
    encoded = [json.dumps(b, separators=(",", ":")).encode() for b in bodies]
    async with http_client(
        HttpSettings(connect_timeout_s=30, read_timeout_s=30), BusSettings(concurrency=concurrency)
    ) as client:
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000, help="requests per path per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--home", type=Path, default=Path(".examlops/bench-bus"))
    args = parser.parse_args()

    home = args.home.resolve()
    # An empty Redis each run: the last run's append-only file (GBs of done keys and replies) takes longer to
    # load than the start-up waits, and the figures should not depend on what earlier runs left.
    shutil.rmtree(home / "redis", ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    base = Settings(home=home)
    catalog = load_catalog(base.catalog_path)
    seed_demo(base, catalog)
    upgrade_database(base)
    spec = catalog.get("JPCP")
    rng = np.random.default_rng(7)
    bodies: list[dict[str, object]] = [
        {"embedding": [float(v) for v in rng.normal(0, 0.05, spec.embedding_dim)], "node_count": 12}
        for _ in range(args.requests)
    ]

    redis_server = EmbeddedRedis(home / "redis", REDIS_PORT)
    redis_server.start()
    redis_server_pid = redis_server.process.pid
    settings = Settings(home=home, redis=RedisSettings(url=redis_server.url))
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXAMLOPS_")}
    env |= {"EXAMLOPS_HOME": str(home), "EXAMLOPS_REDIS__URL": redis_server.url}
    env["EXAMLOPS_SERVING__PORT"] = str(SERVING_PORT)
    serving = start([sys.executable, "-m", "examlops.cli.main", "serve", "start"], env, home / "serving.log")
    bridge_code = "from examlops.cli.bus import bridge_app; bridge_app()"
    bridge = start([sys.executable, "-c", bridge_code, "start", "--log-level", "warning"], env, home / "bridge.log")
    url = f"http://127.0.0.1:{SERVING_PORT}"
    try:
        wait_until(lambda: httpx.get(f"{url}/readyz", timeout=2).status_code == 200, "serving")
        assert redis_server_pid is not None
        meter = CpuMeter({"bridge": bridge.pid, "serving": serving.pid, "redis": redis_server_pid})
        infer_url, named = f"{url}/infer-pipeline/infer", [b | {"model": "JPCP"} for b in bodies]
        loads: dict[str, Callable[[int], Coroutine[Any, Any, Run]]] = {
            "raw http": lambda c: raw_http_load(infer_url, named, c),
            "httpx": lambda c: httpx_load(infer_url, named, c),
            "bus": lambda c: bus_load(settings, str(spec.seanerbus_uuid), bodies, c),
        }
        table: list[tuple[int, dict[str, dict[str, Any]]]] = []
        for concurrency in args.concurrency:
            runs: dict[str, list[Run]] = {path: [] for path in PATHS}
            for round_no in range(args.rounds):
                for path in PATHS:
                    before, cpu_before, batched = meter.read(), time.process_time(), batches(url)
                    run = uvloop.run(loads[path](concurrency))
                    after, cpu_after = meter.read(), time.process_time()
                    sizes, count = (now - then for now, then in zip(batches(url), batched, strict=True))
                    run.batch = sizes / count if count else 0.0
                    jobs = len(run.latencies) + 50  # with the warm-up
                    run.cpu_ms = {k: (after[k] - before[k]) * 1000 / jobs for k in after}
                    run.cpu_ms["client"] = (cpu_after - cpu_before) * 1000 / jobs
                    runs[path].append(run)
                print(f"c={concurrency} round {round_no + 1}/{args.rounds} done", flush=True)
            figures = {path: pooled(runs[path]) for path in PATHS}
            table.append((concurrency, figures))
            print(json.dumps({"concurrency": concurrency, **figures}), flush=True)

        print(f"\n{args.requests} requests per path and round, {args.rounds} interleaved rounds, JPCP,")
        print(f"one serving process, one bridge, all clients on uvloop ({os.cpu_count()} cores)\n")
        print(
            f"{'c':>3} {'path':<9} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'errors':>6} {'batch':>6}  cpu ms per job"
        )
        for concurrency, figures in table:
            for path, row in figures.items():
                cpu = "  ".join(f"{k} {v:.2f}" for k, v in row["cpu_ms_per_job"].items())
                print(
                    f"{concurrency:>3} {path:<9} {row['p50']:>8.2f} {row['p99']:>8.2f} "
                    f"{row['rps']:>8.0f} {row['errors']:>6} {row['serving_batch']:>6.1f}  {cpu}"
                )
            for baseline in ("raw http", "httpx"):
                added = figures["bus"]["p50"] - figures[baseline]["p50"]
                print(f"{concurrency:>3} bus adds {added:.2f} ms at p50 over {baseline}")
            print()
    finally:
        stop(bridge)
        stop(serving)
        redis_server.stop()


if __name__ == "__main__":
    main()
