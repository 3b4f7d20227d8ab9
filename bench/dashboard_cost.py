"""Serving's CPU with one dashboard viewer against none, in one run (issue 22: at most 2 % more).

Seeds the demo state (``demo.demo_state``, ``.examlops/bench-dashboard`` by default), starts a Redis server
and one `exa serve start` with authentication on, and drives it with a steady open-loop load of direct
predictions (``--rate`` per second, Poisson arrivals, ``openloop``; 0 for an idle server). Segments of
``--segment-s`` seconds alternate between no viewer and one viewer, in pairs whose order a seeded shuffle
picks (``--seed``), because this machine's speed drifts over seconds to minutes; both segments of a pair
get the same arrivals and bodies.

The viewer does over HTTP what an open models page does in Chromium: logs in once with the admin token
(session cookie), loads the page and its five static assets at the start of its segment, then every
``--refresh-s`` (the page's default, 5 s) asks for the figures fragment and the chart data, as the page's
htmx trigger and chart script do. A browser's own CPU is not serving's, and Chromium sharing the two cores
would only add noise, so none runs here.

Printed: per segment, serving's CPU seconds (its process and children: predict workers, trace writer) and
the answered predictions; per pair, the viewer's cost (CPU with a viewer / CPU without - 1); over the pairs
the median, quartiles and range; and the CPU per refresh (the mean difference over the refreshes in a
segment). Figures only: nothing here asserts anything.

    .venv/bin/python bench/dashboard_cost.py [--pairs 4] [--segment-s 30] [--rate 50] [--refresh-s 5] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo import admin_token, auth_headers, demo_state
from demo import bodies as demo_bodies
from openloop import open_loop
from procs import CpuMeter, answers, free_port, quantile, start, stop, wait_until

from examlops.platform.redis_server import EmbeddedRedis

ASSETS = ("htmx.min.js", "uPlot.iife.min.js", "uPlot.min.css", "dashboard.js", "dashboard.css")


async def viewer(base: str, token: str, seconds: float, refresh_s: float) -> int:
    """One open models page for ``seconds``: the page and its assets once, then a refresh each ``refresh_s``.
    Returns the refreshes made."""
    refreshes = 0
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        login = await client.post("/dashboard/login", data={"token": token})
        assert login.status_code == 303, login.text
        (await client.get("/dashboard/models")).raise_for_status()
        for name in ASSETS:
            (await client.get(f"/dashboard/static/{name}")).raise_for_status()
        ends = time.monotonic() + seconds
        while True:
            await asyncio.sleep(refresh_s)
            if time.monotonic() >= ends:
                return refreshes
            for path in ("/dashboard/models/fragment", "/dashboard/models/series.json"):
                (await client.get(path)).raise_for_status()
            refreshes += 1


async def segment(
    base: str, token: str, on: bool, args: argparse.Namespace, bodies: list[bytes], seed: int
) -> tuple[int, int]:
    """(answered predictions, viewer refreshes) of one segment; ``seed`` draws its arrivals and bodies (both
    segments of a pair get the same)."""
    headers = {"Authorization": f"Bearer {token}"}

    async def load() -> int:
        if args.rate <= 0:
            await asyncio.sleep(args.segment_s)
            return 0
        sent = await open_loop(
            f"{base}/v1/models/JPCP/predict", args.rate, args.segment_s,
            lambda rng: ("predict", 10_000.0, bodies[rng.randrange(len(bodies))]),
            headers=headers, seed=seed,
        )  # fmt: skip
        return sum(1 for s in sent if s.status == 200)

    if on:
        answered, refreshes = await asyncio.gather(load(), viewer(base, token, args.segment_s, args.refresh_s))
        return answered, refreshes
    return await load(), 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--segment-s", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=50.0, help="Background predictions per second (0: idle).")
    parser.add_argument("--refresh-s", type=float, default=5.0, help="The page's refresh (its default: 5 s).")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--home", type=Path, default=Path(".examlops/bench-dashboard"))
    args = parser.parse_args()

    home = args.home.resolve()
    settings, catalog = demo_state(home)
    token = admin_token(settings)
    bodies = [orjson.dumps(b) for b in demo_bodies(catalog.get("JPCP").embedding_dim, 64, seed=args.seed)]
    redis = EmbeddedRedis(home / "redis", free_port())
    redis.start()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXAMLOPS_")}
    env |= {"EXAMLOPS_HOME": str(home), "EXAMLOPS_SERVING__PORT": str(port), "EXAMLOPS_REDIS__URL": redis.url}
    process = start([sys.executable, "-m", "examlops.cli.main", "serve", "start"], env, home / "serving.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(answers(f"{base}/readyz"), f"serving (see {home}/serving.log)", proc=process)
        httpx.post(f"{base}/v1/models/JPCP/predict", content=bodies[0], headers=auth_headers(settings)
                   | {"Content-Type": "application/json"}, timeout=30).raise_for_status()  # fmt: skip
        asyncio.run(segment(base, token, True, argparse.Namespace(**{**vars(args), "segment_s": 6.0}), bodies, 0))
        meter = CpuMeter({"serving": process.pid})
        rng = random.Random(args.seed)
        orders = [(False, True), (True, False)] * (args.pairs // 2) + [(False, True)] * (args.pairs % 2)
        rng.shuffle(orders)
        costs, per_refresh = [], []
        print(f"rate {args.rate}/s, segments of {args.segment_s:.0f} s, refresh every {args.refresh_s:.0f} s, "
              f"seed {args.seed}")  # fmt: skip
        print("pair  viewer  serving CPU s  predictions  refreshes")
        for pair, order in enumerate(orders, 1):
            cpu: dict[bool, float] = {}
            refreshes = 0
            for on in order:
                before = meter.read()["serving"]
                answered, made = asyncio.run(segment(base, token, on, args, bodies, args.seed * 1000 + pair))
                cpu[on] = meter.read()["serving"] - before
                refreshes += made
                print(f"{pair:>4}  {'one' if on else 'none':>6}  {cpu[on]:>13.3f}  {answered:>11}  {made:>9}")
            costs.append(cpu[True] / cpu[False] - 1.0)
            per_refresh.append((cpu[True] - cpu[False]) / max(1, refreshes) * 1000.0)
        ordered = sorted(costs)
        print(
            f"viewer's cost over {len(costs)} pairs: median {statistics.median(costs):+.2%}, quartiles "
            f"{quantile(ordered, 0.25):+.2%} .. {quantile(ordered, 0.75):+.2%}, range {ordered[0]:+.2%} .. "
            f"{ordered[-1]:+.2%}; per refresh (fragment + chart data): median "
            f"{statistics.median(per_refresh):.2f} ms of serving CPU"
        )
    finally:
        stop(process)
        redis.stop()


if __name__ == "__main__":
    main()
