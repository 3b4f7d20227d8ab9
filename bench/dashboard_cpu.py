"""Serving's CPU with dashboard viewers at the default refresh, against none (issue 22: at most 2 % per viewer).

Seeds the demo state (``demo.demo_state``), starts a Redis server, fills the audit trail to ``--audit-events``
signed events and stores one verify result (as `exa audit verify` does: the Control page shows it and walks
nothing), then starts one `exa serve start` with authentication on, and measures serving's CPU seconds
(psutil: its process and children, user + system) in two parts of one run:

1. **Rounds under load.** Each round drives the same open-loop load once with no viewer and once per page of
   ``--pages`` with ``--viewers`` viewers on it (``--predictions`` direct predictions at ``--rate`` per
   second, Poisson arrivals of one seed per round, ``openloop``); the order of the segments rotates between
   rounds, because this machine's speed drifts over minutes. N viewers make the signal N times one viewer's,
   so that it stands above the spread of same-load segments; the cost of one viewer is (ratio - 1) / N.
   Printed per round: each CPU figure and ratio; then per page the median and spread of one viewer's cost.
2. **One viewer alone** (no load): per polled address, ``--burst`` requests back to back, less the idle CPU
   of the same wall time, gives the CPU per request; a page's **refresh cycle** is what it polls in one
   default refresh period (``site.REFRESH_S``), each address weighted by how often it is polled in that
   period. The derived share is that CPU per second over serving's CPU per second under load without a
   viewer (part 1), per page.

A viewer does over HTTP what Chromium does with the page open: logs in (its own session cookie), loads the
page, its five static assets and its charts' first data once (outside the measured window: a browser opens a
page once), then polls what the page's HTML asks for, read from the served HTML itself: each ``hx-get`` with
its ``hx-trigger="every Ns"`` (htmx's first poll comes after N s) and each ``data-series`` with its
``data-refresh`` (``dashboard.js``: 5 s when absent). The browser's own CPU is not serving's and is not run.
Figures only: nothing here asserts anything.

    .venv/bin/python bench/dashboard_cpu.py [--rounds 4] [--predictions 1000] [--rate 50] [--viewers 10]
        [--pages models,control] [--audit-events 30000] [--idle-s 15] [--burst 100] [--seed 1]
        [--home .examlops/bench-dashboard-cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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

from examlops.core.settings import RedisSettings, Settings
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


async def loaded(base: str, token: str, bodies: list[bytes], args: argparse.Namespace, seed: int,
                 page: str | None, meter: CpuMeter) -> tuple[float, tuple[int, int], int]:  # fmt: skip
    """(serving CPU s, (predictions sent, answered), viewer requests) of the round's load with ``--viewers``
    viewers on ``page``, or none (None). Every segment of a round sends the same arrivals and bodies."""
    headers = {"Authorization": f"Bearer {token}"}

    async def load() -> tuple[int, int]:
        sent = await open_loop(
            f"{base}/v1/models/JPCP/predict", args.rate, args.predictions / args.rate,
            lambda rng: ("predict", 10_000.0, bodies[rng.randrange(len(bodies))]), headers=headers, seed=seed,
        )  # fmt: skip
        return len(sent), sum(1 for s in sent if s.status == 200)

    if page is None:
        before = meter.read()["serving"]
        counts = await load()
        return meter.read()["serving"] - before, counts, 0
    async with contextlib.AsyncExitStack() as stack:
        viewers = [await stack.enter_async_context(opened(base, token, page)) for _ in range(args.viewers)]
        done = asyncio.Event()
        before = meter.read()["serving"]
        polling = [asyncio.create_task(poll(client, pollers, done)) for client, pollers in viewers]
        counts = await load()
        done.set()
        made = sum(await asyncio.gather(*polling))
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


def seed_audit(settings: Settings, events: int) -> tuple[int, float]:
    """The trail filled to ``events`` signed events (appended in batches, checkpointed), then verified once
    and the result stored (``monitoring.audit.verified``) as `exa audit verify` and the retention flow do:
    (events in the trail, seconds the verify took)."""
    from examlops.bootstrap.control import audit_access, audit_trail
    from examlops.monitoring.audit import Entry
    from examlops.monitoring.audit.verified import record_verify
    from examlops.monitoring.audit.verify import verify

    with audit_trail(settings) as trail:
        have = int(trail.redis.hget("examlops:audit:head", "seq") or 0)
        for first in range(have, events, 500):
            now = time.time()
            trail.append_many([Entry("traffic.changed", f"model-{i % 3}", {"i": i, "by": "bench"}, now)
                               for i in range(first, min(events, first + 500))])  # fmt: skip
            trail.checkpoint_now()
    with audit_access(settings) as audit:
        t0 = time.perf_counter()
        report = verify(audit.store, audit.secret, audit.checkpoints, archive=audit.archive)
        took = time.perf_counter() - t0
        record_verify(audit.store.redis, audit.secret, report, "bench/dashboard_cpu.py")
    return report.events, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--predictions", type=int, default=1000, help="Predictions per segment (fixed work).")
    parser.add_argument("--rate", type=float, default=50.0, help="Predictions per second, open loop.")
    parser.add_argument("--viewers", type=int, default=10, help="Viewers on the page in a segment with viewers.")
    parser.add_argument("--pages", default="models,control", help="The viewers' pages in the rounds, comma-separated.")
    parser.add_argument("--audit-events", type=int, default=30_000, help="Signed events in the trail.")
    parser.add_argument("--idle-s", type=float, default=15.0, help="Seconds of idle serving CPU measured.")
    parser.add_argument("--burst", type=int, default=100, help="Requests per address in the viewer-alone part.")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--home", type=Path, default=Path(".examlops/bench-dashboard-cpu"))
    args = parser.parse_args()
    pages = [p for p in args.pages.split(",") if p]
    if not pages or any(p not in PAGES for p in pages):
        parser.error(f"--pages takes some of {', '.join(PAGES)}")
    sys.stdout.reconfigure(line_buffering=True)  # progress while it runs

    home = args.home.resolve()
    settings, catalog = demo_state(home)
    token = admin_token(settings)
    bodies = [orjson.dumps(b) for b in demo_bodies(catalog.get("JPCP").embedding_dim, 64, seed=args.seed)]
    redis = EmbeddedRedis(home / "redis", free_port())
    redis.start()
    events, verify_s = seed_audit(settings.model_copy(update={"redis": RedisSettings(url=redis.url)}),
                                  args.audit_events)  # fmt: skip
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
        print(f"load: {args.predictions} predictions at {args.rate:g}/s per segment; {len(catalog.names)} catalog "
              f"models; {args.viewers} viewer(s) per segment on {', '.join(pages)} at the default refresh "
              f"({REFRESH_S} s); audit trail {events} events (one verify: {verify_s:.2f} s, stored, not run by "
              f"serving); load average {os.getloadavg()}")  # fmt: skip
        print("round  segment   CPU s   ratio   sent  answered  viewer requests")
        costs: dict[str, list[float]] = {page: [] for page in pages}
        rates = []
        for r in range(1, args.rounds + 1):
            segments: list[str | None] = [None, *pages]
            order = segments[r % len(segments) :] + segments[: r % len(segments)]
            cpu: dict[str | None, tuple[float, tuple[int, int], int]] = {}
            for page in order:
                cpu[page] = asyncio.run(loaded(base, token, bodies, args, args.seed * 1000 + r, page, meter))
            off_s = cpu[None][0]
            rates.append(off_s / (args.predictions / args.rate))
            for page in order:
                on_s, (sent, answered), made = cpu[page]
                if page is not None:
                    costs[page].append((on_s / off_s - 1.0) / args.viewers)
                print(f"{r:>5}  {page or 'none':<8} {on_s:>6.3f}  {on_s / off_s:.4f}  {sent:>5}  {answered:>8}  "
                      f"{made:>15}")  # fmt: skip
        for page, found in costs.items():
            ordered = sorted(found)
            print(f"/{page}: one viewer's cost (ratio - 1) / {args.viewers} over {len(found)} rounds: median "
                  f"{statistics.median(found):+.2%}, quartiles {quantile(ordered, 0.25):+.2%} .. "
                  f"{quantile(ordered, 0.75):+.2%}, range {ordered[0]:+.2%} .. {ordered[-1]:+.2%}")  # fmt: skip
        serving_per_s = statistics.median(rates)
        print(f"serving's CPU under this load without a viewer: median {serving_per_s * 1000:.1f} ms per second")
        before, t0 = meter.read()["serving"], time.monotonic()
        time.sleep(args.idle_s)
        idle_per_s = (meter.read()["serving"] - before) / (time.monotonic() - t0)
        per_prediction_ms = max(1e-6, (serving_per_s - idle_per_s) * 1000.0 / args.rate)
        print(f"serving idle (no load, no viewer, {args.idle_s:g} s): {idle_per_s * 1000:.1f} ms per second; "
              f"under load {per_prediction_ms:.2f} ms per prediction above idle")  # fmt: skip
        print(f"viewer alone (no load), {args.burst} requests per address, idle CPU subtracted; load average "
              f"{os.getloadavg()}")  # fmt: skip
        print("page      address                          every s  CPU ms/request  ms per refresh cycle")
        for page in PAGES:
            costs_of = asyncio.run(alone(base, token, page, args.burst, meter))
            cycle = sum(ms * REFRESH_S / every for ms, every in costs_of.values())
            for path, (ms, every) in costs_of.items():
                print(f"{page:<9} {path:<32} {every:>7g}  {ms:>14.2f}  {ms * REFRESH_S / every:>20.2f}")
            share = cycle / REFRESH_S / (serving_per_s * 1000.0)
            # 2 % of serving's CPU is at least the viewer's ms/s once idle + rate * per prediction >= 50 * that
            floor = max(0.0, (50.0 * cycle / REFRESH_S - idle_per_s * 1000.0) / per_prediction_ms)
            print(f"{page:<9} refresh cycle ({REFRESH_S} s): {cycle:.2f} ms of serving CPU, {cycle / REFRESH_S:.2f} "
                  f"ms/s: {share:.2%} of serving's CPU at {args.rate:g} predictions/s, "
                  f"{cycle / REFRESH_S / max(1e-6, idle_per_s * 1000.0):.2%} of it idle; one viewer stays under "
                  f"2 % from about {floor:.0f} predictions/s up")  # fmt: skip
    finally:
        stop(process)
        redis.stop()


if __name__ == "__main__":
    main()
