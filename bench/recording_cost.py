"""Recording on against off at a steady bus load: the throughput cost, the recorder's backlog, and 1:1 counts.

Starts a real redis-server (``EmbeddedRedis`` on a free port), seeds the demo
models and runs `exa serve start` on a free port, all in a fresh state folder
(``.examlops/bench-recording`` by default). Then, in turns, one
`exa bridge start --no-record` and one `exa bridge start` (recording on) take
the same bounded load: a warm-up, then ``--jobs`` bus jobs to JPCP at
``--concurrency`` through ``BusClient``. Only one bridge runs at a time.

    .venv/bin/python bench/recording_cost.py [--jobs 3000] [--concurrency 32] [--rounds 4]

The client runs on uvloop, as the bridge does. Per turn, the CPU each process
spent per job (the bridge with its recorder thread, serving with its pool
workers, Redis, the client) shows where recording's cost lands. This machine's
speed drifts by tens of percent over minutes, so jobs/s of one turn against the
next is noisy; the CPU per job of all processes together, on against off, is
the steadier figure of the same cost (the load saturates the cores). Rounds
alternate their order (off-on, on-off, ...) so that a drift of the machine's
speed within a round does not always land on the same side, and each round's
own on/off figures are printed as a pair: their median and spread say how far
the overall figure can be trusted.

Printed per turn: jobs/s, p50 and p99 of the round trip; with recording on,
the recorder's backlog while the load runs. The bridge exposes no metrics
endpoint, so the backlog is measured from outside, honestly and without
touching the bridge: jobs answered (replies the client received) minus drift
snapshots written (XLEN of the model's snapshot stream), sampled every 0.2 s.
That is the recorder's queue plus the batch it is writing (at most 64). At
the end: snapshots == ``inference.served`` audit events == jobs answered,
for recording on, and no new snapshot or event for recording off.

Figures only: nothing here asserts; the check is printed as OK or MISMATCH. Target: a cost of at most 5 %.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import CpuMeter, quantile, start, stop, wait_until

from examlops.core.settings import RedisSettings, Settings
from examlops.monitoring.audit import INFERENCE_SERVED
from examlops.monitoring.audit import STREAM as AUDIT_STREAM
from examlops.monitoring.snapshots import stream_of
from examlops.platform.redis_server import EmbeddedRedis
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from examlops.serving.bus_client import BusClient

MODEL = "JPCP"
RECORDER_CPU = re.compile(r"recorder: .* of CPU writing \(([0-9.]+) us per record\)")
WARM_UP = 200


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Turn:
    record: bool
    round_no: int = 0
    jobs: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    backlog: list[int] = field(default_factory=list)
    backlog_at_end: int = 0
    drain_s: float = 0.0
    new_snapshots: int = 0
    new_events: int = 0
    answered: int = 0
    cpu_ms: dict[str, float] = field(default_factory=dict)
    recorder_us: float | None = None
    """The recorder thread's CPU per record, from the bridge's closing log line."""

    @property
    def rps(self) -> float:
        return self.jobs / self.seconds


def served_events(client: redis.Redis) -> int:
    """``inference.served`` events on the audit stream, read in pages."""
    count, start_id = 0, "-"
    while True:
        page: Any = client.xrange(AUDIT_STREAM, min=start_id, count=2000)
        count += sum(1 for _id, fields in page if fields.get("type") == INFERENCE_SERVED)
        if len(page) < 2000:
            return count
        start_id = "(" + page[-1][0]


def snapshots(client: redis.Redis) -> int:
    return int(client.xlen(stream_of(MODEL)))


async def run_turn(
    settings: Settings, client: redis.Redis, address: str, bodies: list[dict[str, Any]], concurrency: int, turn: Turn
) -> None:
    answered = 0
    first = snapshots(client)
    async with BusClient.from_settings(settings, caller="bench-recording") as bus:
        for body in bodies[:WARM_UP]:
            await bus.request(address, body, 30)
        answered += WARM_UP
        if turn.record:  # start from a drained recorder, so the backlog below is the load's own
            wait_until(lambda: snapshots(client) >= first + WARM_UP, "the warm-up's snapshots", 60)
        before = snapshots(client)
        queue = list(range(len(bodies)))
        sampling = turn.record

        async def sampler() -> None:
            while sampling:
                turn.backlog.append(answered - WARM_UP - (snapshots(client) - before))
                await asyncio.sleep(0.2)

        async def worker() -> None:
            nonlocal answered
            while queue:
                i = queue.pop()
                began = time.perf_counter()
                reply = await bus.request(address, bodies[i], 30)
                turn.latencies_ms.append((time.perf_counter() - began) * 1000)
                turn.errors += reply.get("error") is not None
                answered += 1

        sampling_task = asyncio.create_task(sampler())
        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        turn.seconds = time.perf_counter() - began
        sampling = False
        await sampling_task
    turn.jobs, turn.answered = len(bodies), answered
    if turn.record:
        turn.backlog_at_end = answered - WARM_UP - (snapshots(client) - before)
        ended = time.perf_counter()
        with_snapshots = before + len(bodies)
        try:
            wait_until(lambda: snapshots(client) >= with_snapshots, "the recorder's backlog to drain", 60)
        finally:
            turn.drain_s = time.perf_counter() - ended


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4, help="Rounds of one turn off and one on (order alternating).")
    parser.add_argument("--home", type=Path, default=Path(".examlops/bench-recording"))
    args = parser.parse_args()

    home = args.home.resolve()
    shutil.rmtree(home / "redis", ignore_errors=True)  # counts start from an empty Redis
    home.mkdir(parents=True, exist_ok=True)
    base = Settings(home=home)
    catalog = load_catalog(base.catalog_path)
    seed_demo(base, catalog)
    spec = catalog.get(MODEL)
    rng = np.random.default_rng(11)
    bodies: list[dict[str, Any]] = [
        {"embedding": [float(v) for v in rng.normal(0, 0.05, spec.embedding_dim)], "node_count": 12}
        for _ in range(args.jobs)
    ]

    redis_server = EmbeddedRedis(home / "redis", free_port())
    redis_server.start()
    redis_pid = redis_server.process.pid
    assert redis_pid is not None
    serving_port = free_port()
    settings = Settings(home=home, redis=RedisSettings(url=redis_server.url))
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXAMLOPS_")}
    env |= {"EXAMLOPS_HOME": str(home), "EXAMLOPS_REDIS__URL": redis_server.url}
    env["EXAMLOPS_SERVING__PORT"] = str(serving_port)
    exa = [sys.executable, "-m", "examlops.cli.main"]
    serving = start([*exa, "serve", "start"], env, home / "serving.log")
    url = f"http://127.0.0.1:{serving_port}"
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    turns: list[Turn] = []
    try:
        wait_until(lambda: httpx.get(f"{url}/readyz", timeout=2).status_code == 200, "serving")
        for round_no in range(args.rounds):
            for record in (False, True) if round_no % 2 == 0 else (True, False):
                turn = Turn(record, round_no)
                snaps, events = snapshots(client), served_events(client)
                log = home / f"bridge-{'on' if record else 'off'}-{round_no}.log"
                argv = [*exa, "bridge", "start", "--concurrency", str(args.concurrency)]
                bridge = start(argv + ([] if record else ["--no-record"]), env, log)
                try:
                    wait_until(lambda: " ready: " in log.read_text(errors="replace"), "the bridge")  # noqa: B023
                    meter = CpuMeter({"bridge": bridge.pid, "serving": serving.pid, "redis": redis_pid})
                    before, client_before = meter.read(), time.process_time()
                    uvloop.run(run_turn(settings, client, str(spec.seanerbus_uuid), bodies, args.concurrency, turn))
                    after, client_after = meter.read(), time.process_time()
                    turn.cpu_ms = {k: (after[k] - before[k]) * 1000 / max(1, turn.answered) for k in after}
                    turn.cpu_ms["client"] = (client_after - client_before) * 1000 / max(1, turn.answered)
                finally:
                    stop(bridge)  # recording on: the recorder flushes on SIGTERM
                found = RECORDER_CPU.search(log.read_text(errors="replace"))
                turn.recorder_us = float(found.group(1)) if found else None
                turn.new_snapshots = snapshots(client) - snaps
                turn.new_events = served_events(client) - events
                turns.append(turn)
                print(
                    f"round {round_no + 1} recording {'on ' if record else 'off'}: {turn.rps:.0f} jobs/s, "
                    f"p50 {statistics.median(turn.latencies_ms):.2f} ms, errors {turn.errors}",
                    flush=True,
                )
    finally:
        client.close()
        stop(serving)
        redis_server.stop()
    report(turns, args)


def report(turns: list[Turn], args: argparse.Namespace) -> None:
    print(f"\n{args.jobs} bus jobs per turn to {MODEL} at c={args.concurrency} after {WARM_UP} warm-up jobs; ")
    print(f"one serving process, one bridge at a time ({os.cpu_count()} cores)\n")
    header = f"{'turn':<5} {'recording':<9} {'jobs/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}"
    print(header + f" {'backlog p50/max/end':>20} {'drain s':>7}  cpu ms per job")
    for i, turn in enumerate(turns):
        row = (
            f"{i + 1:<5} {'on' if turn.record else 'off':<9} {turn.rps:>7.0f} "
            f"{statistics.median(turn.latencies_ms):>8.2f} {quantile(turn.latencies_ms, 0.99):>8.2f} {turn.errors:>6}"
        )
        backlog, drain = "", ""
        if turn.record and turn.backlog:
            backlog = f"{statistics.median(turn.backlog):.0f}/{max(turn.backlog)}/{turn.backlog_at_end}"
            drain = f"{turn.drain_s:.2f}"
        cpu = "  ".join(f"{k} {v:.2f}" for k, v in turn.cpu_ms.items())
        print(f"{row} {backlog:>20} {drain:>7}  {cpu}")
    off = [t for t in turns if not t.record]
    on = [t for t in turns if t.record]
    rps_off = sum(t.jobs for t in off) / sum(t.seconds for t in off)
    rps_on = sum(t.jobs for t in on) / sum(t.seconds for t in on)
    cost = 100 * (1 - rps_on / rps_off)
    print(f"\nthroughput: off {rps_off:.0f} jobs/s, on {rps_on:.0f} jobs/s: recording costs {cost:.1f} %")
    for name in turns[0].cpu_ms:
        off_cpu = statistics.median(t.cpu_ms[name] for t in off)
        on_cpu = statistics.median(t.cpu_ms[name] for t in on)
        print(f"cpu ms per job, {name}: off {off_cpu:.3f}, on {on_cpu:.3f} ({on_cpu - off_cpu:+.3f})")
    # Every process shares the cores and the load saturates them, so the CPU a job costs in all bounds
    # jobs/s: this share is the throughput cost with the machine's changing speed divided out of it.
    all_off = statistics.median(sum(t.cpu_ms.values()) for t in off)
    all_on = statistics.median(sum(t.cpu_ms.values()) for t in on)
    share = 100 * (all_on - all_off) / all_on
    print(f"cpu ms per job, all processes: off {all_off:.3f}, on {all_on:.3f}: recording takes {share:.1f} % of it")
    pairs = [(t_off, t_on) for t_off in off for t_on in on if t_off.round_no == t_on.round_no]
    if len(pairs) > 1:
        by_rps = sorted(100 * (1 - t_on.rps / t_off.rps) for t_off, t_on in pairs)
        by_cpu = sorted(100 * (1 - sum(t_off.cpu_ms.values()) / sum(t_on.cpu_ms.values())) for t_off, t_on in pairs)
        for name, costs in (("throughput", by_rps), ("cpu share", by_cpu)):
            quartiles = statistics.quantiles(costs, n=4) if len(costs) >= 4 else [costs[0], 0.0, costs[-1]]
            print(
                f"per round, {name} cost: median {statistics.median(costs):.1f} %, "
                f"quartiles {quartiles[0]:.1f} / {quartiles[2]:.1f} %, range {costs[0]:.1f} to {costs[-1]:.1f} %"
            )
    recorder_us = [t.recorder_us for t in on if t.recorder_us is not None]
    if recorder_us:
        # The recorder thread's own CPU, timed in the bridge: the part of recording's cost that the machine's
        # drift barely moves (Redis's part is in the redis line above).
        median_us = statistics.median(recorder_us)
        print(
            f"recorder thread, CPU per record: median {median_us:.1f} us (range {min(recorder_us):.1f} to "
            f"{max(recorder_us):.1f}), {100 * median_us / 1000 / all_on:.1f} % of a job's CPU in all processes"
        )
    p50_off = statistics.median([v for t in off for v in t.latencies_ms])
    p50_on = statistics.median([v for t in on for v in t.latencies_ms])
    print(f"p50: off {p50_off:.2f} ms, on {p50_on:.2f} ms ({p50_on - p50_off:+.2f} ms)")
    print("\ncounts per turn (snapshots == inference.served events == jobs answered incl. warm-up):")
    for i, turn in enumerate(turns):
        expected = turn.answered if turn.record else 0
        ok = turn.new_snapshots == turn.new_events == expected
        print(
            f"  turn {i + 1} recording {'on ' if turn.record else 'off'}: snapshots {turn.new_snapshots}, "
            f"events {turn.new_events}, expected {expected}: {'OK' if ok else 'MISMATCH'}"
        )


if __name__ == "__main__":
    main()
