"""Bus round trip against direct HTTP: what the Redis bus and the bridge add to a prediction.

Starts a real redis-server, `exa serve start` and one `exa bridge start` on a
state folder with the demo models (``.examlops/bench-bus`` by default), then
for each concurrency sends the same bounded count of JPCP requests two ways:

- raw http: POST /infer-pipeline/infer on keep-alive connections (``loadgen``,
  a minimal asyncio client, so the client is not what is measured);
- httpx: the same POST through the bridge's own httpx client and call
  (``bridge_handler.http_client``, pre-encoded body): what the hop costs alone;
- bus: ``BusClient.request`` (XADD, the bridge's XREADGROUP, its POST over
  httpx, the reply script, the client's XREAD).

    .venv/bin/python bench/bus_vs_http.py [--requests 2000] [--concurrency 1 32]

Figures only: nothing here asserts anything. Target: the bus adds at most 2 ms at p50.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import run_load
from procs import quantile, start, stop, wait_until

from examlops.core.settings import HttpSettings, RedisSettings, Settings
from examlops.platform.redis_server import EmbeddedRedis
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from examlops.serving.bridge_handler import JSON_HEADERS, http_client
from examlops.serving.bus_client import BusClient

SERVING_PORT, REDIS_PORT = 18101, 18104


async def bus_load(
    settings: Settings, address: str, bodies: list[dict[str, object]], concurrency: int
) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    async with BusClient.from_settings(settings, caller="bench") as client:
        for body in bodies[:50]:  # warm-up: connections, the script cache
            await client.request(address, body, 30)
        queue = list(range(len(bodies)))

        async def worker() -> None:
            nonlocal errors
            while queue:
                i = queue.pop()
                began = time.perf_counter()
                reply = await client.request(address, bodies[i], 30)
                latencies.append((time.perf_counter() - began) * 1000)
                errors += reply.get("error") is not None

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - began
    return summary(latencies, seconds, errors)


def summary(latencies: list[float], seconds: float, errors: int) -> dict[str, float]:
    return {
        "p50": statistics.median(latencies),
        "p99": quantile(latencies, 0.99),
        "rps": len(latencies) / seconds,
        "errors": errors,
    }


async def raw_http_load(url: str, bodies: list[dict[str, object]], concurrency: int) -> dict[str, float]:
    """Direct HTTP with ``loadgen`` (raw keep-alive sockets): the server's own latency."""
    encoded = [json.dumps(b).encode() for b in bodies]
    await run_load(url, lambda i: encoded[i % len(encoded)], total=50, concurrency=1)
    # Bounded: at c=32 a loadgen connection was seen to wait forever for a reply; report that, not hang.
    load = run_load(url, lambda i: encoded[i], total=len(encoded), concurrency=concurrency, max_seconds=120)
    result = await asyncio.wait_for(load, 150)
    return summary(result.latencies_ms, result.seconds, result.errors)


async def httpx_load(url: str, bodies: list[dict[str, object]], concurrency: int) -> dict[str, float]:
    """Direct HTTP with httpx, configured and called exactly as the bridge's hop is (``bridge_handler``)."""
    latencies: list[float] = []
    errors = 0
    encoded = [json.dumps(b, separators=(",", ":")).encode() for b in bodies]
    async with http_client(HttpSettings(connect_timeout_s=30, read_timeout_s=30), concurrency) as client:
        for body in encoded[:50]:
            await client.post(url, content=body, headers=JSON_HEADERS)
        queue = list(range(len(bodies)))

        async def worker() -> None:
            nonlocal errors
            while queue:
                i = queue.pop()
                began = time.perf_counter()
                reply = await client.post(url, content=encoded[i], headers=JSON_HEADERS)
                latencies.append((time.perf_counter() - began) * 1000)
                errors += reply.status_code != 200

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - began
    return summary(latencies, seconds, errors)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--home", type=Path, default=Path(".examlops/bench-bus"))
    args = parser.parse_args()

    home = args.home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    base = Settings(home=home)
    catalog = load_catalog(base.catalog_path)
    seed_demo(base, catalog)
    spec = catalog.get("JPCP")
    rng = np.random.default_rng(7)
    bodies: list[dict[str, object]] = [
        {"embedding": [float(v) for v in rng.normal(0, 0.05, spec.embedding_dim)], "node_count": 12}
        for _ in range(args.requests)
    ]

    redis_server = EmbeddedRedis(home / "redis", REDIS_PORT)
    redis_server.start()
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
        rows = []
        infer_url, named = f"{url}/infer-pipeline/infer", [b | {"model": "JPCP"} for b in bodies]
        for concurrency in args.concurrency:
            figures: dict[str, dict[str, float]] = {}
            try:
                figures["raw http"] = asyncio.run(raw_http_load(infer_url, named, concurrency))
            except TimeoutError:
                print(f"c={concurrency}: raw http (loadgen) did not finish; left out", flush=True)
            figures["httpx"] = asyncio.run(httpx_load(infer_url, named, concurrency))
            figures["bus"] = asyncio.run(bus_load(settings, str(spec.seanerbus_uuid), bodies, concurrency))
            rows.append((concurrency, figures))
            print(f"c={concurrency}: {figures}", flush=True)
        print(f"\n{args.requests} requests per run, JPCP, one serving process, one bridge ({os.cpu_count()} cores)\n")
        print(f"{'c':>3} {'path':<9} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'errors':>6}")
        for concurrency, figures in rows:
            for name, row in figures.items():
                print(
                    f"{concurrency:>3} {name:<9} {row['p50']:>8.2f} {row['p99']:>8.2f} "
                    f"{row['rps']:>8.0f} {int(row['errors']):>6}"
                )
            for baseline in ("raw http", "httpx"):
                if baseline in figures:
                    added = figures["bus"]["p50"] - figures[baseline]["p50"]
                    print(f"{concurrency:>3} bus adds {added:.2f} ms at p50 over {baseline}")
            print()
    finally:
        stop(bridge)
        stop(serving)
        redis_server.stop()


if __name__ == "__main__":
    main()
