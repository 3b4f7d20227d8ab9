"""Alias flips under a steady load: does a hot reload drop or slow down traffic?

Seeds the demo models and the admin identity into a state folder (``.examlops/bench-reload`` by
default, ``demo.demo_state``), starts
`exa serve start` with polling off, and sends JPCP requests for ``--seconds`` over ``--concurrency``
keep-alive connections, paced to ``--rate`` requests a second in all (a bounded load: the server is
not saturated, so the latency measured is the server's and not a queue's). After ``--steady``
seconds it flips Production between versions 1 and 2 ``--flips`` times with ``promote()``, the
function `exa promote` calls (move the alias in MLflow, POST /admin/reload, wait until /v1/models
reports the new version), spread over the next part of the run, then lets the load run out. The load
and the promotions send the state folder's admin token.

    .venv/bin/python bench/reload_flips.py [--seconds 60] [--steady 20] [--flips 20] [--rate 200]

Prints requests sent and failed, p50/p99 of the steady part (after a 2 s warm-up) against the
flipping part, the versions seen in replies, and how long each promotion took. Figures only:
nothing here asserts. Target: 0 failed, p99 while flipping at most 2x the steady p99.

The client is a minimal asyncio HTTP/1.1 client (as ``loadgen.py``) that also reads the version
from each reply; latency counts from the moment a request is written, so a stall of the server
shows up in the requests that were in flight and not in the ones paced behind them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo import admin_token, demo_state
from loadgen import header_lines
from procs import answers, quantile, start, stop, wait_until

from examlops.core.settings import Settings
from examlops.promotion.service import promote
from examlops.registry.mlflow_registry import MlflowRegistry

PORT = 18111


@dataclass
class Reply:
    started: float
    latency_ms: float
    status: int
    version: str | None


@dataclass
class Run:
    replies: list[Reply] = field(default_factory=list)
    broken: int = 0
    flips: list[tuple[float, float, str]] = field(default_factory=list)
    """(started, ended, version) of every promotion."""


async def connection(
    host: str, port: int, bodies: list[bytes], run: Run, interval: float, until: float, extra: str
) -> None:
    """Paced POSTs of ``bodies`` until ``until``, each with the header lines ``extra`` (``loadgen.header_lines``:
    its Content-Type and the token)."""
    reader, writer = await asyncio.open_connection(host, port)
    next_at = time.monotonic()
    i = 0
    try:
        while (now := time.monotonic()) < until:
            if now < next_at:
                await asyncio.sleep(next_at - now)
            next_at += interval
            body = bodies[i % len(bodies)]
            i += 1
            head = (
                f"POST /infer-pipeline/infer HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"{extra}Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            started = time.monotonic()
            writer.write(head + body)
            status_line = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            payload = await reader.readexactly(length)
            latency = (time.monotonic() - started) * 1000
            status = int(status_line.split()[1]) if status_line else 0
            version = json.loads(payload).get("version") if status == 200 else None
            run.replies.append(Reply(started, latency, status, version))
    except (OSError, asyncio.IncompleteReadError, ValueError):
        run.broken += 1
    finally:
        writer.close()


def flipper(
    home: Path, url: str, start_at: float, end_at: float, flips: int, out: Queue[tuple[float, float, str]]
) -> None:
    """In its own process: MLflow's client work must not share the load generator's GIL."""
    settings = Settings(home=home)
    token = admin_token(settings)
    registry = MlflowRegistry(settings.mlflow_tracking_uri, settings.state_dir / "cache" / "models")
    spacing = (end_at - start_at) / flips
    for k in range(flips):
        time.sleep(max(0.0, start_at + k * spacing - time.monotonic()))  # monotonic: one clock for all processes
        version = 2 if k % 2 == 0 else 1
        began = time.monotonic()
        promote(settings, registry, "JPCP", "Production", version=version, instances=[url], timeout_s=60, token=token)
        out.put((began, time.monotonic(), str(version)))


async def load(args: argparse.Namespace, settings: Settings, url: str, bodies: list[bytes]) -> Run:
    run = Run()
    began = time.monotonic()
    until = began + args.seconds
    flips_from = began + args.steady
    flips_to = until - args.tail
    ctx = multiprocessing.get_context("spawn")
    flips: Queue[tuple[float, float, str]] = ctx.Queue()
    process = ctx.Process(
        target=flipper, args=(settings.home, url, flips_from, flips_to, args.flips, flips), name="flipper"
    )
    process.start()
    interval = args.concurrency / args.rate
    extra = header_lines({"Authorization": f"Bearer {admin_token(settings)}"})
    await asyncio.gather(
        *(connection("127.0.0.1", PORT, bodies, run, interval, until, extra) for _ in range(args.concurrency))
    )
    run.flips = [await asyncio.to_thread(flips.get, True, 120) for _ in range(args.flips)]
    await asyncio.to_thread(process.join, 60)
    return run


def report(args: argparse.Namespace, run: Run, began: float) -> None:
    steady = [r.latency_ms for r in run.replies if began + 2 <= r.started < began + args.steady]
    first, last = run.flips[0][0], run.flips[-1][1]
    flipping = [r.latency_ms for r in run.replies if first <= r.started <= last]
    failed = sum(1 for r in run.replies if r.status != 200) + run.broken
    p99_steady, p99_flips = quantile(steady, 0.99), quantile(flipping, 0.99)
    took = [ended - started for started, ended, _ in run.flips]
    print(f"load: {args.concurrency} connections paced to {args.rate:g} req/s for {args.seconds:g} s")
    print(f"requests sent: {len(run.replies) + run.broken}   failed: {failed}   broken connections: {run.broken}")
    print(f"statuses: {dict(Counter(r.status for r in run.replies))}")
    print(f"steady   ({len(steady)} requests): p50 {quantile(steady, 0.5):.1f} ms  p99 {p99_steady:.1f} ms")
    print(
        f"flipping ({len(flipping)} requests, {len(run.flips)} flips over {last - first:.1f} s): "
        f"p50 {quantile(flipping, 0.5):.1f} ms  p99 {p99_flips:.1f} ms  ({p99_flips / p99_steady:.2f}x steady)"
    )
    print(f"max latency while flipping: {max(flipping, default=float('nan')):.1f} ms")
    print(f"versions seen in replies: {dict(sorted(Counter(r.version for r in run.replies).items(), key=str))}")
    print(f"promote() took: median {quantile(took, 0.5) * 1000:.0f} ms, max {max(took) * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--steady", type=float, default=20)
    parser.add_argument("--tail", type=float, default=5, help="Seconds of load after the last flip.")
    parser.add_argument("--flips", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rate", type=float, default=200, help="Requests a second, all connections together.")
    parser.add_argument("--workers", type=int, default=2, help="Predict workers of the serving process.")
    parser.add_argument("--home", type=Path, default=Path(".examlops/bench-reload"))
    args = parser.parse_args()

    home = args.home.resolve()
    settings, _catalog = demo_state(home)
    registry = MlflowRegistry(settings.mlflow_tracking_uri, home / "cache" / "models")
    registry.set_alias("JPCP", "Production", "1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXAMLOPS_")}
    env.update(
        EXAMLOPS_HOME=str(home),
        EXAMLOPS_HOTSET__RELOAD_POLL_S="0",
        EXAMLOPS_PREDICT__WORKERS=str(args.workers),
    )
    url = f"http://127.0.0.1:{PORT}"
    proc = start(
        [sys.executable, "-m", "examlops.cli.main", "serve", "start", "--port", str(PORT)], env, home / "serving.log"
    )
    try:
        wait_until(answers(f"{url}/readyz"), f"serving (see {home / 'serving.log'})", proc=proc)
        rng = np.random.default_rng(11)
        bodies = [
            json.dumps(
                {"model": "JPCP", "embedding": [float(v) for v in rng.normal(0, 0.05, 384)], "node_count": 12}
            ).encode()
            for _ in range(256)
        ]
        began = time.monotonic()
        run = asyncio.run(load(args, settings, url, bodies))
        report(args, run, began)
    finally:
        registry.set_alias("JPCP", "Production", "1")
        stop(proc)


if __name__ == "__main__":
    main()
