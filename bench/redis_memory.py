"""Redis memory under steady bus traffic with retention running: does ``used_memory`` stay flat?

Starts a real redis-server, `exa serve start` and one `exa bridge start`
(recording on, as deployed) on a state folder with the demo models
(``.examlops/bench-redis-memory`` by default), then sends JPCP jobs through
the bus at a steady ``--rate`` for ``--minutes``. Every ``--archive-every``
seconds it runs the retention flow's two tasks in this process
(``flows.retention``: the audit archive and the snapshot trim, with
``--snapshot-max-age``), and every ``--sample-every`` seconds it samples Redis
``used_memory``, the memory of the streams retention bounds (the audit stream
and the snapshot streams, ``MEMORY USAGE``) and the key count.

Printed: one row per sample, then whether every sample after the first archive
stays within 10 % of the first one (total memory, and the retained streams
alone), and finally ``verify`` over archive and stream.

Bus structures that retention does not touch are bounded by their own limits:
a job's done key lives its deadline (``--deadline``) plus 600 s
(``bus.wire.DONE_MARGIN_S``), and the client's reply stream keeps its last
10,000 replies (``bus.wire.REPLY_STREAM_MAXLEN``), so the total grows until
both level off. ``--warm-up`` seconds of traffic before the first archive let
them level off first (about ``--deadline`` + 600 for a faithful run of the
claim "flat after the first archive"). The retained streams go up and down by
what one archive interval adds, since the archive moves whole checkpointed
segments (a checkpoint every ``EXAMLOPS_AUDIT__CHECKPOINT_EVERY`` events).

    .venv/bin/python bench/redis_memory.py [--minutes 10] [--rate 100] [--warm-up 0]

Figures only: nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo import bodies as demo_bodies
from demo import demo_state
from procs import start, stop, wait_until

from examlops.bootstrap.bridge import bus_client
from examlops.bootstrap.control import ControlPlane, audit_access
from examlops.core.settings import RedisSettings, Settings
from examlops.flows.wiring import prefect_environment
from examlops.monitoring.audit.store import STREAM as AUDIT_STREAM
from examlops.monitoring.audit.verify import verify
from examlops.monitoring.snapshots import MODELS, stream_of
from examlops.platform.redis_server import EmbeddedRedis

SERVING_PORT, REDIS_PORT = 18111, 18114
TOLERANCE = 0.10


@dataclass
class Sample:
    t: float
    used: int
    retained: int
    keys: int
    archived_so_far: int


@dataclass
class Load:
    sent: int = 0
    errors: int = 0
    stop: threading.Event = field(default_factory=threading.Event)


def retained_bytes(client: redis.Redis) -> int:
    """Memory of the audit stream and every snapshot stream: what retention keeps bounded."""
    models: Any = client.smembers(MODELS)
    keys = [AUDIT_STREAM, *(stream_of(str(m)) for m in models)]
    return sum(int(client.memory_usage(key, samples=0) or 0) for key in keys)


async def steady_load(
    settings: Settings, address: str, bodies: list[dict[str, Any]], rate: float, deadline_s: float, load: Load
) -> None:
    """``rate`` bus jobs a second, each with a ``deadline_s`` deadline, until ``load.stop`` is set."""
    async with bus_client(settings) as client:
        pending: set[asyncio.Task[None]] = set()

        async def one(i: int) -> None:
            reply = await client.request(address, bodies[i % len(bodies)], deadline_s)
            load.errors += reply.get("error") is not None

        began = time.monotonic()
        while not load.stop.is_set():
            due = int((time.monotonic() - began) * rate)
            while load.sent < due:
                task = asyncio.create_task(one(load.sent))
                pending.add(task)
                task.add_done_callback(pending.discard)
                load.sent += 1
            await asyncio.sleep(0.02)
        await asyncio.gather(*pending, return_exceptions=True)


def retention(settings: Settings, max_age_s: float) -> dict[str, Any]:
    """The retention flow's tasks, called as the flow calls them (without Prefect's engine)."""
    from examlops.flows.retention import archive_audit, trim_snapshots

    plane = ControlPlane(settings)
    try:
        audit = archive_audit.fn(settings)
        snapshots = trim_snapshots.fn(plane, max_age_s, time.time())
    finally:
        plane.snapshot_stream.redis.close()
    return {"audit": audit, "snapshots": snapshots}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10.0, help="traffic after the first archive")
    parser.add_argument("--rate", type=float, default=100.0, help="bus jobs per second")
    parser.add_argument("--warm-up", type=float, default=0.0, help="seconds of traffic before the first archive")
    parser.add_argument("--archive-every", type=float, default=10.0)
    parser.add_argument("--sample-every", type=float, default=10.0)
    parser.add_argument("--snapshot-max-age", type=float, default=60.0)
    parser.add_argument("--deadline", type=float, default=30.0, help="each job's deadline, seconds")
    parser.add_argument("--home", type=Path, default=Path(".examlops/bench-redis-memory"))
    args = parser.parse_args()

    home = args.home.resolve()
    for stale in ("redis", "audit", "examlops.db"):  # every run starts from an empty Redis and archive
        target = home / stale
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
    _base, catalog = demo_state(home)
    spec = catalog.get("JPCP")
    bodies = demo_bodies(spec.embedding_dim, 500, seed=7)

    redis_server = EmbeddedRedis(home / "redis", REDIS_PORT)
    redis_server.start()
    settings = Settings(home=home, redis=RedisSettings(url=redis_server.url))
    prefect_environment(settings, api=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXAMLOPS_")}
    env |= {"EXAMLOPS_HOME": str(home), "EXAMLOPS_REDIS__URL": redis_server.url}
    env["EXAMLOPS_SERVING__PORT"] = str(SERVING_PORT)
    serving = start([sys.executable, "-m", "examlops.cli.main", "serve", "start"], env, home / "serving.log")
    bridge_code = "from examlops.cli.bus import bridge_app; bridge_app()"
    bridge = start([sys.executable, "-c", bridge_code, "start", "--log-level", "warning"], env, home / "bridge.log")
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    load = Load()
    loader = threading.Thread(
        target=lambda: uvloop.run(
            steady_load(settings, str(spec.seanerbus_uuid), bodies, args.rate, args.deadline, load)
        ),
        daemon=True,
    )
    samples: list[Sample] = []
    first_archive: float | None = None
    archived = 0
    try:
        url = f"http://127.0.0.1:{SERVING_PORT}"
        wait_until(lambda: httpx.get(f"{url}/readyz", timeout=2).status_code == 200, "serving", proc=serving)
        began = time.monotonic()
        loader.start()
        next_archive, next_sample = began + args.warm_up, began
        end = began + args.warm_up + args.minutes * 60
        print(f"{'t s':>6} {'used MB':>9} {'retained MB':>12} {'keys':>8} {'archived':>9} {'jobs':>8}", flush=True)
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_archive:
                report = retention(settings, args.snapshot_max_age)
                archived += report["audit"]["archived"]
                first_archive = first_archive or time.monotonic()
                next_archive += args.archive_every
            if now >= next_sample:
                now = time.monotonic()
                info: Any = client.info("memory")
                sample = Sample(
                    now - began, int(info["used_memory"]), retained_bytes(client), int(client.dbsize()), archived
                )
                samples.append(sample)
                print(
                    f"{sample.t:>6.0f} {sample.used / 1e6:>9.2f} {sample.retained / 1e6:>12.2f} {sample.keys:>8} "
                    f"{archived:>9} {load.sent:>8}" + ("" if first_archive else "  (before the first archive)"),
                    flush=True,
                )
                next_sample += args.sample_every
            time.sleep(0.2)
        load.stop.set()
        loader.join(60)
        retention(settings, args.snapshot_max_age)
        with audit_access(settings) as audit:
            result = verify(audit.store, audit.secret, audit.checkpoints, archive=audit.archive)
    finally:
        load.stop.set()
        client.close()
        stop(bridge)
        stop(serving)
        redis_server.stop()

    assert first_archive is not None
    after = [s for s in samples if s.t >= first_archive - began]
    print(f"\n{load.sent} jobs at {args.rate:.0f}/s ({load.errors} errors), archive every {args.archive_every:.0f} s,")
    print(f"snapshots kept {args.snapshot_max_age:.0f} s, {len(after)} samples after the first archive\n")
    used = [s.used for s in after]
    spread = max(abs(v - used[0]) for v in used) / used[0]
    print(
        f"used_memory: first {used[0] / 1e6:.2f} MB, min {min(used) / 1e6:.2f}, max {max(used) / 1e6:.2f}: at most "
        f"{spread:.1%} from the first sample: {'flat' if spread <= TOLERANCE else 'NOT flat'} (within {TOLERANCE:.0%})"
    )
    # The retained streams go up and down by what one archive interval adds (the archive moves whole
    # checkpointed segments); bounded means no growth from one half of the run to the other.
    retained = [s.retained for s in after]
    half = len(retained) // 2
    if half:
        growth = max(retained[half:]) / max(retained[:half]) - 1
        print(
            f"retained streams: min {min(retained) / 1e6:.2f} MB, max {max(retained) / 1e6:.2f} MB; peak of the "
            f"second half {growth:+.1%} against the first: {'bounded' if growth <= TOLERANCE else 'GROWING'}"
        )
    print(f"keys: {after[0].keys} -> {after[-1].keys} (done keys live {args.deadline:.0f} s + 600 s)")
    print("verify:", json.dumps(result.to_json()))


if __name__ == "__main__":
    main()
