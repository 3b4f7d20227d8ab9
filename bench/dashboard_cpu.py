"""Serving's CPU with one dashboard viewer at the default refresh, against none (issue 22: at most 2 % more).

Seeds the demo state (``demo.demo_state``), starts a Redis server and one `exa serve start` with
authentication on, and measures serving's CPU seconds (psutil: its process and children, user + system) in
two parts of one run:

1. **Rounds under load.** Each round drives the same open-loop load twice (``--predictions`` direct
   predictions at ``--rate`` per second, Poisson arrivals of one seed per round, ``openloop``), once with no
   viewer and once with one viewer on ``--page``; the order alternates between rounds, because this
   machine's speed drifts over minutes. Printed per round: both CPU figures and their ratio; then the median
   and spread of the viewer's cost (ratio - 1).
2. **The viewer alone** (no load): per polled address, ``--burst`` requests back to back, less the idle CPU
   of the same wall time, gives the CPU per request; a page's **refresh cycle** is what it polls in one
   default refresh period (``site.REFRESH_S``), each address weighted by how often it is polled in that
   period. The derived share is that CPU per second over serving's CPU per second under load without a
   viewer (part 1), per page.

The viewer does over HTTP what Chromium does with the page open: logs in (session cookie), loads the page,
its five static assets and its charts' first data once (outside the measured window: a browser opens a page
once), then polls what the page's HTML asks for, read from the served HTML itself: each ``hx-get`` with its
``hx-trigger="every Ns"`` (htmx's first poll comes after N s) and each ``data-series`` with its
``data-refresh`` (``dashboard.js``: 5 s when absent). The browser's own CPU is not serving's and is not run.
Figures only: nothing here asserts anything.

    .venv/bin/python bench/dashboard_cpu.py [--rounds 6] [--predictions 1500] [--rate 50] [--page models]
        [--burst 100] [--seed 1] [--home .examlops/bench-dashboard-cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo import admin_token, auth_headers, demo_state
from demo import bodies as demo_bodies
from openloop import open_loop
from procs import CpuMeter, answers, free_port, quantile, start, stop, wait_until

from examlops.dashboard.access import STATIC
from examlops.dashboard.site import PREFIX, REFRESH_S
from examlops.platform.redis_server import EmbeddedRedis

PAGES = ("models", "drift", "control", "traces")
HX = re.compile(r'hx-get="([^"]+)"[^>]*hx-trigger="every (\d+(?:\.\d+)?)s"')
SERIES = re.compile(r'data-series="([^"]+)"(?:[^>]*data-refresh="(\d+(?:\.\d+)?)")?')


def polled(html: str) -> list[tuple[str, float]]:
    """(address, seconds between polls) of everything the page's HTML polls."""
    found = [(path, float(every)) for path, every in HX.findall(html)]
    found += [(path, float(every or 5)) for path, every in SERIES.findall(html)]
    return found


@asynccontextmanager
async def opened(base: str, token: str, page: str) -> AsyncIterator[tuple[httpx.AsyncClient, list[tuple[str, float]]]]:
    """A logged-in client with ``page`` open (page, assets, charts' first data): the client and what it polls."""
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        login = await client.post(f"{PREFIX}/login", data={"token": token})
        assert login.status_code == 303, login.text
        reply = await client.get(f"{PREFIX}/{page}")
        reply.raise_for_status()
        for name in STATIC:
            (await client.get(f"{PREFIX}/static/{name}")).raise_for_status()
        pollers = polled(reply.text)
        for path in {p for p, _ in SERIES.findall(reply.text)}:
            (await client.get(path)).raise_for_status()
        yield client, pollers


async def poll(client: httpx.AsyncClient, pollers: list[tuple[str, float]], until: asyncio.Event) -> int:
    """Each address at its interval (first poll one interval in) until ``until`` is set; returns requests."""

    async def one(path: str, every: float) -> int:
        made = 0
        while True:
            try:
                await asyncio.wait_for(until.wait(), every)
                return made
            except TimeoutError:
                (await client.get(path, headers={"HX-Request": "true"})).raise_for_status()
                made += 1

    return sum(await asyncio.gather(*(one(path, every) for path, every in pollers)))


async def loaded(base: str, token: str, bodies: list[bytes], args: argparse.Namespace, seed: int, on: bool,
                 meter: CpuMeter) -> tuple[float, tuple[int, int], int]:  # fmt: skip
    """(serving CPU s, (predictions sent, answered), viewer requests) of the round's load with or without a
    viewer. Both segments of a round send the same arrivals and bodies (one seed)."""
    headers = {"Authorization": f"Bearer {token}"}

    async def load() -> tuple[int, int]:
        sent = await open_loop(
            f"{base}/v1/models/JPCP/predict", args.rate, args.predictions / args.rate,
            lambda rng: ("predict", 10_000.0, bodies[rng.randrange(len(bodies))]), headers=headers, seed=seed,
        )  # fmt: skip
        return len(sent), sum(1 for s in sent if s.status == 200)

    if not on:
        before = meter.read()["serving"]
        counts = await load()
        return meter.read()["serving"] - before, counts, 0
    async with opened(base, token, args.page) as (client, pollers):
        done = asyncio.Event()
        before = meter.read()["serving"]
        viewer = asyncio.create_task(poll(client, pollers, done))
        counts = await load()
        done.set()
        made = await viewer
        return meter.read()["serving"] - before, counts, made


async def alone(base: str, token: str, page: str, burst: int, meter: CpuMeter) -> dict[str, tuple[float, float]]:
    """Per address ``page`` polls: (serving CPU ms per request, seconds between polls), idle CPU subtracted."""
    out: dict[str, tuple[float, float]] = {}
    async with opened(base, token, page) as (client, pollers):
        for path, every in pollers:
            before, t0 = meter.read()["serving"], time.monotonic()
            for _ in range(burst):
                (await client.get(path, headers={"HX-Request": "true"})).raise_for_status()
            busy, wall = meter.read()["serving"] - before, time.monotonic() - t0
            before = meter.read()["serving"]
            await asyncio.sleep(wall)
            idle = meter.read()["serving"] - before
            out[path] = (max(0.0, busy - idle) / burst * 1000.0, every)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--predictions", type=int, default=1500, help="Predictions per segment (fixed work).")
    parser.add_argument("--rate", type=float, default=50.0, help="Predictions per second, open loop.")
    parser.add_argument("--page", choices=PAGES, default="models", help="The viewer's page in the rounds.")
    parser.add_argument("--burst", type=int, default=100, help="Requests per address in the viewer-alone part.")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--home", type=Path, default=Path(".examlops/bench-dashboard-cpu"))
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # progress while it runs

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
        meter = CpuMeter({"serving": process.pid})
        print(f"load: {args.predictions} predictions at {args.rate:g}/s per segment; viewer on /{args.page} "
              f"at the default refresh ({REFRESH_S} s); load average {os.getloadavg()}")  # fmt: skip
        print("round  first  no viewer CPU s  one viewer CPU s  ratio   sent  answered off/on  viewer requests")
        costs, rates = [], []
        for r in range(1, args.rounds + 1):
            order = (False, True) if r % 2 else (True, False)
            cpu: dict[bool, tuple[float, tuple[int, int], int]] = {}
            for on in order:
                cpu[on] = asyncio.run(loaded(base, token, bodies, args, args.seed * 1000 + r, on, meter))
            off_s, on_s = cpu[False][0], cpu[True][0]
            costs.append(on_s / off_s - 1.0)
            rates.append(off_s / (args.predictions / args.rate))
            print(f"{r:>5}  {'one' if order[0] else 'none':>5}  {off_s:>15.3f}  {on_s:>16.3f}  {on_s / off_s:.4f}  "
                  f"{cpu[False][1][0]:>5}  {cpu[False][1][1]:>7}/{cpu[True][1][1]:<7}  {cpu[True][2]:>15}")  # fmt: skip
        ordered = sorted(costs)
        print(f"viewer's cost over {len(costs)} rounds: median {statistics.median(costs):+.2%}, quartiles "
              f"{quantile(ordered, 0.25):+.2%} .. {quantile(ordered, 0.75):+.2%}, range {ordered[0]:+.2%} .. "
              f"{ordered[-1]:+.2%}")  # fmt: skip
        serving_per_s = statistics.median(rates)
        print(f"serving's CPU under this load without a viewer: median {serving_per_s * 1000:.1f} ms per second")
        print(f"viewer alone (no load), {args.burst} requests per address, idle CPU subtracted; load average "
              f"{os.getloadavg()}")  # fmt: skip
        print("page      address                          every s  CPU ms/request  ms per refresh cycle")
        for page in PAGES:
            costs_of = asyncio.run(alone(base, token, page, args.burst, meter))
            cycle = sum(ms * REFRESH_S / every for ms, every in costs_of.values())
            for path, (ms, every) in costs_of.items():
                print(f"{page:<9} {path:<32} {every:>7g}  {ms:>14.2f}  {ms * REFRESH_S / every:>20.2f}")
            share = cycle / REFRESH_S / (serving_per_s * 1000.0)
            print(f"{page:<9} refresh cycle ({REFRESH_S} s): {cycle:.2f} ms of serving CPU, {cycle / REFRESH_S:.2f} "
                  f"ms/s: {share:.2%} of serving's CPU at {args.rate:g} predictions/s")  # fmt: skip
    finally:
        stop(process)
        redis.stop()


if __name__ == "__main__":
    main()
