"""Recording on against off at a steady bus load: the throughput cost, the recorder's backlog, and 1:1 counts.

Starts a real redis-server (``EmbeddedRedis`` on a free port), seeds the demo
models and runs `exa serve start` on a free port, all in a fresh state folder
(``.examlops/bench-recording`` by default). Two bridges run side by side for
the whole of a phase: `exa bridge start --no-record --model A` and
`exa bridge start --model B` (recording on). The load alternates between them
in short segments: ``--jobs`` bus jobs at ``--concurrency`` through
``BusClient`` to model A (recording off), then to model B (recording on), or
the other way round (a seeded shuffle picks each round's order). A
bridge whose model gets no jobs waits in its blocking read and costs nothing.
Halfway the bridges are restarted with the models swapped, so a difference
between the two models' own cost lands on both sides equally.

Why this shape: this machine's speed drifts by tens of percent over seconds to
minutes. Restarting a bridge per turn made each turn ~10 s long and left one
turn against the next ±10 % apart with the same code. Segments of ~1.5 s with
both bridges already warm put an on/off pair within ~3 s of each other, and
many pairs give the figure a spread that says how far it can be trusted: the
mean of the pairs' costs is printed with twice its standard error.

Per segment, the first ``--warm-up`` replies are not timed (the load ramps up,
the recorder reaches its steady backlog), nor are the last ``--concurrency``
(the load ramps down): jobs/s is the completions between those over the time
between them. After a segment with recording on the bench waits until the
recorder has written every snapshot, so no recording work spills into the next
segment; the CPU each process spent (read from /proc after that wait) is
divided by the segment's jobs, so it includes all of the recording's work.
A bridge's CPU includes its children's: the bridge writes each job's record
with its reply (one atomic script) and its recording child, at nice 19, writes
the snapshots and events; the loaded bridge's figures are printed per thread
(main: the event loop) and for its children (the recording child).

Redis rewrites its AOF under this load (the bus appends ~9.6 KB a job to it,
most of it the job's payload; recording adds ~0.9 KB), and a rewrite's child
takes a core for a large part of a segment. Each segment notes whether a
rewrite ran during its load and the AOF bytes it appended; the cost is printed
over all pairs and over the pairs with no rewrite in either segment. Redis
starts a rewrite when the AOF passes 64 MB and has grown to 5x its size after
the last one (``platform/redis_server.py``; at Redis's 2x it was every few
seconds here), so every so many segments: with the order strictly alternating
(off-on, on-off, ...) rewrites fell in segments with recording on more than
twice as often as in those with it off, in each of four runs, though those
wrote 52 % of the bytes, perhaps that period meeting the order's. Each phase
now runs as many rounds of each order, shuffled (``--seed``).

``--control`` runs both bridges with recording off: the "cost" it prints is
the bench's own bias and noise, and should be ~0.

    .venv/bin/python bench/recording_cost.py [--jobs 1000] [--concurrency 32] [--rounds 12] [--seed 1]
        [--control]

``--rounds`` is the number of on/off pairs per phase (two phases). The
recorder's backlog while the load runs is measured from outside: jobs answered
minus drift snapshots written (XLEN of the model's snapshot stream), sampled
every 0.2 s; that is the recorder's queue plus the batch it is writing. At the
end of each phase: new snapshots == new ``inference.served`` events == jobs
answered by the recording bridge, and no snapshot for the other model.

Figures only: nothing here asserts; the check is printed as OK or MISMATCH. Target: a cost of at most 5 %.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
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
from procs import CpuMeter, free_port, quantile, start, stop, thread_cpu, wait_until

from examlops.bootstrap.bridge import bus_client
from examlops.bus.client import BusClient
from examlops.core.settings import RedisSettings, Settings
from examlops.monitoring.audit import INFERENCE_SERVED
from examlops.monitoring.audit import STREAM as AUDIT_STREAM
from examlops.monitoring.snapshots import stream_of
from examlops.platform.redis_server import EmbeddedRedis

MODELS = ("JPCP", "CRCP")
RECORDER_CPU = re.compile(r"recorder: .* of CPU writing \(([0-9.]+) us per record\)")


@dataclass
class Segment:
    record: bool
    model: str
    round_no: int
    jobs: int = 0
    errors: int = 0
    timed: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    backlog: list[int] = field(default_factory=list)
    drain_s: float = 0.0
    cpu_ms: dict[str, float] = field(default_factory=dict)
    threads_ms: dict[str, float] = field(default_factory=dict)
    """The loaded bridge's CPU per job: its event loop's thread (main), its other threads, its children."""
    started: int = 0
    """AOF rewrites that started during the segment's load: each forks Redis, and its child takes a core."""
    touched: bool = False
    """Whether a rewrite ran at any time during the segment's load (also one started before it)."""
    aof_bytes: float | None = None
    """Bytes appended to the AOF per job (None when a rewrite ran during the segment)."""

    @property
    def rps(self) -> float:
        return self.timed / self.seconds


@dataclass
class Phase:
    recording_model: str
    answered_on: int = 0
    answered_off: int = 0
    new_snapshots_on: int = 0
    new_snapshots_off: int = 0
    new_events: int = 0
    recorder_us: float | None = None


def served_events(client: redis.Redis) -> int:
    """``inference.served`` events on the audit stream, read in pages."""
    count, start_id = 0, "-"
    while True:
        page: Any = client.xrange(AUDIT_STREAM, min=start_id, count=2000)
        count += sum(1 for _id, fields in page if fields.get("type") == INFERENCE_SERVED)
        if len(page) < 2000:
            return count
        start_id = "(" + page[-1][0]


def round_orders(rounds: int, seed: int) -> list[tuple[bool, bool]]:
    """Each round's order (recording off first or on first): as many of each, shuffled with ``seed``."""
    orders = [(False, True), (True, False)] * (rounds // 2)
    rng = random.Random(seed)
    if rounds % 2:
        orders.append(rng.choice([(False, True), (True, False)]))
    rng.shuffle(orders)
    return orders


def aof_forks(client: redis.Redis) -> tuple[int, int, int]:
    """Redis's forks so far (AOF rewrites: the bench's Redis saves no RDB), 1 while one is running, and the
    bytes written to the AOF since the last rewrite."""
    stats: Any = client.info("stats")
    persistence: Any = client.info("persistence")
    written = int(persistence["aof_current_size"]) - int(persistence["aof_base_size"])
    return int(stats["total_forks"]), int(persistence["aof_rewrite_in_progress"]), written


def snapshots(client: redis.Redis, model: str) -> int:
    return int(client.xlen(stream_of(model)))


async def run_segment(
    bus: BusClient,
    client: redis.Redis,
    address: str,
    bodies: list[dict[str, Any]],
    args: argparse.Namespace,
    segment: Segment,
) -> None:
    """The load of one segment; returns once every reply is in (recording may still be writing)."""
    before = snapshots(client, segment.model)
    todo = list(range(args.warm_up + args.jobs))
    done_at: list[float] = []
    sampling = segment.record

    async def sampler() -> None:
        while sampling:
            segment.backlog.append(len(done_at) - (snapshots(client, segment.model) - before))
            await asyncio.sleep(0.2)

    async def worker() -> None:
        while todo:
            i = todo.pop()
            began = time.perf_counter()
            reply = await bus.request(address, bodies[i % len(bodies)], 30)
            ended = time.perf_counter()
            done_at.append(ended)
            if len(done_at) > args.warm_up:
                segment.latencies_ms.append((ended - began) * 1000)
            segment.errors += reply.get("error") is not None

    sampling_task = asyncio.create_task(sampler())
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    sampling = False
    await sampling_task
    first, last = args.warm_up, len(done_at) - 1 - args.concurrency
    segment.jobs = len(done_at)
    segment.timed = last - first
    segment.seconds = done_at[last] - done_at[first]


def run_phase(
    phase_no: int,
    recording_model: str,
    context: dict[str, Any],
    args: argparse.Namespace,
    segments: list[Segment],
) -> Phase:
    exa, env, home, client = context["exa"], context["env"], context["home"], context["client"]
    catalog, bodies = context["catalog"], context["bodies"]
    plain_model = next(m for m in MODELS if m != recording_model)
    phase = Phase(recording_model)
    base = [*exa, "bridge", "start", "--concurrency", str(args.concurrency)]
    logs = {flag: home / f"bridge-{phase_no}-{flag}.log" for flag in ("off", "on")}
    bridges: dict[str, subprocess.Popen[bytes]] = {}
    snaps_on, snaps_off = snapshots(client, recording_model), snapshots(client, plain_model)
    events = served_events(client)
    try:
        bridges["off"] = start([*base, "--no-record", "--model", plain_model], env, logs["off"])
        on_argv = [*base, "--model", recording_model] + (["--no-record"] if args.control else [])
        bridges["on"] = start(on_argv, env, logs["on"])
        for flag, log in logs.items():
            wait_until(lambda: " ready: " in log.read_text(errors="replace"), f"the {flag} bridge", proc=bridges[flag])  # noqa: B023
        pids = {f"bridge-{flag}": proc.pid for flag, proc in bridges.items()}
        meter = CpuMeter(pids | {"serving": context["serving_pid"], "redis": context["redis_pid"]})

        async def load() -> None:
            async with bus_client(context["settings"]) as bus:
                for round_no, order in enumerate(round_orders(args.rounds, args.seed + phase_no)):
                    for record in order:
                        model = recording_model if record else plain_model
                        segment = Segment(record, model, round_no + phase_no * args.rounds)
                        address = str(catalog.get(model).seanerbus_uuid)
                        cpu_before, client_before = meter.read(), time.process_time()
                        bridge_pid = bridges["on" if record else "off"].pid
                        threads_before = thread_cpu(bridge_pid)
                        snaps_before = snapshots(client, model)
                        forks_before, rewriting, aof_before = aof_forks(client)
                        await run_segment(bus, client, address, bodies, args, segment)
                        client_after = time.process_time()
                        forks_loaded, rewriting_at_end, _ = aof_forks(client)
                        segment.started = forks_loaded - forks_before
                        segment.touched = bool(segment.started or rewriting or rewriting_at_end)
                        if record and not args.control:
                            ended = time.perf_counter()
                            target = snaps_before + segment.jobs
                            while snapshots(client, model) < target:
                                if time.perf_counter() - ended > 60:
                                    raise SystemExit("the recorder's backlog did not drain in 60 s")
                                await asyncio.sleep(0.01)
                            segment.drain_s = time.perf_counter() - ended
                        cpu_after = meter.read()
                        forks_after, _, aof_after = aof_forks(client)
                        if forks_after == forks_before and not rewriting:  # else the AOF restarted meanwhile
                            segment.aof_bytes = (aof_after - aof_before) / segment.jobs
                        threads_after = thread_cpu(bridge_pid)
                        spent = {k: cpu_after[k] - cpu_before[k] for k in cpu_after}
                        per_job = 1000 / segment.jobs
                        segment.cpu_ms = {
                            "bridges": (spent["bridge-off"] + spent["bridge-on"]) * per_job,
                            "serving": spent["serving"] * per_job,
                            "redis": spent["redis"] * per_job,
                            "client": (client_after - client_before) * per_job,
                        }
                        segment.threads_ms = {
                            k: (threads_after[k] - threads_before[k]) * per_job for k in threads_after
                        }
                        # What the loaded bridge's children (its recording process) spent.
                        own = sum(threads_after[k] - threads_before[k] for k in threads_after)
                        loaded = spent["bridge-on" if record else "bridge-off"]
                        segment.threads_ms["children"] = max(0.0, loaded - own) * per_job
                        if record:
                            phase.answered_on += segment.jobs
                        else:
                            phase.answered_off += segment.jobs
                        segments.append(segment)
                        label = ("off*" if args.control else "on ") if record else "off"
                        print(
                            f"round {segment.round_no + 1:>2} recording {label} ({model}): "
                            f"{segment.rps:.0f} jobs/s, p50 {statistics.median(segment.latencies_ms):.2f} ms, "
                            f"errors {segment.errors}" + (", an AOF rewrite ran" if segment.touched else ""),
                            flush=True,
                        )

        uvloop.run(load())
    finally:
        for proc in bridges.values():
            stop(proc)  # recording on: the recorder flushes on SIGTERM and logs its CPU
    found = RECORDER_CPU.search(logs["on"].read_text(errors="replace"))
    phase.recorder_us = float(found.group(1)) if found else None
    phase.new_snapshots_on = snapshots(client, recording_model) - snaps_on
    phase.new_snapshots_off = snapshots(client, plain_model) - snaps_off
    phase.new_events = served_events(client) - events
    return phase


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, help="Timed jobs per segment (plus the warm-up).")
    parser.add_argument("--warm-up", type=int, default=200, help="Untimed jobs at the start of each segment.")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=12, help="On/off pairs per phase (two phases).")
    parser.add_argument("--control", action="store_true", help="Both bridges without recording: the bench's bias.")
    parser.add_argument("--seed", type=int, default=1, help="Seeds the order of the rounds (printed).")
    parser.add_argument("--home", type=Path, default=Path(".examlops/bench-recording"))
    args = parser.parse_args()

    home = args.home.resolve()
    shutil.rmtree(home / "redis", ignore_errors=True)  # counts start from an empty Redis
    _base, catalog = demo_state(home)
    dims = {catalog.get(m).embedding_dim for m in MODELS}
    if len(dims) != 1:
        raise SystemExit(f"the models {MODELS} must take embeddings of one length, not {sorted(dims)}")
    bodies = demo_bodies(dims.pop(), 1000, seed=11)

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
    segments: list[Segment] = []
    phases: list[Phase] = []
    context = {
        "exa": exa,
        "env": env,
        "home": home,
        "client": client,
        "catalog": catalog,
        "bodies": bodies,
        "settings": settings,
        "serving_pid": serving.pid,
        "redis_pid": redis_pid,
    }
    try:
        wait_until(lambda: httpx.get(f"{url}/readyz", timeout=2).status_code == 200, "serving", proc=serving)
        for phase_no, recording_model in enumerate(reversed(MODELS)):
            phases.append(run_phase(phase_no, recording_model, context, args, segments))
    finally:
        client.close()
        stop(serving)
        redis_server.stop()
    report(segments, phases, args)


def spread(costs: list[float]) -> str:
    mean = statistics.fmean(costs)
    se = statistics.stdev(costs) / math.sqrt(len(costs)) if len(costs) > 1 else float("nan")
    quartiles = statistics.quantiles(costs, n=4) if len(costs) >= 4 else [min(costs), 0.0, max(costs)]
    return (
        f"mean {mean:.1f} % ± {2 * se:.1f} (2 SE), median {statistics.median(costs):.1f} %, "
        f"quartiles {quartiles[0]:.1f} / {quartiles[2]:.1f} %, range {min(costs):.1f} to {max(costs):.1f} %"
    )


def report(segments: list[Segment], phases: list[Phase], args: argparse.Namespace) -> None:
    on_label = "off*" if args.control else "on"
    print(
        f"\n{args.jobs} timed bus jobs per segment at c={args.concurrency}, after {args.warm_up} untimed; "
        f"{args.rounds} on/off pairs per phase, 2 phases (models swapped), order seed {args.seed}; "
        f"{os.cpu_count()} cores"
    )
    if args.control:
        print("CONTROL RUN: the 'on' bridge records nothing too (off*); any cost below is the bench's own bias")
    print(f"\n{'seg':<4} {'rec':<4} {'model':<5} {'jobs/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'err':>4}", end="")
    print(f" {'backlog p50/max':>16} {'drain s':>7}  cpu ms per job")
    for i, seg in enumerate(segments):
        backlog = f"{statistics.median(seg.backlog):.0f}/{max(seg.backlog)}" if seg.backlog else ""
        drain = f"{seg.drain_s:.2f}" if seg.record and not args.control else ""
        cpu = "  ".join(f"{k} {v:.2f}" for k, v in seg.cpu_ms.items())
        print(
            f"{i + 1:<4} {on_label if seg.record else 'off':<4} {seg.model:<5} {seg.rps:>7.0f} "
            f"{statistics.median(seg.latencies_ms):>7.2f} {quantile(seg.latencies_ms, 0.99):>7.2f} {seg.errors:>4}"
            f" {backlog:>16} {drain:>7}  {cpu}"
        )
    off = [s for s in segments if not s.record]
    on = [s for s in segments if s.record]
    rps_off = sum(s.timed for s in off) / sum(s.seconds for s in off)
    rps_on = sum(s.timed for s in on) / sum(s.seconds for s in on)
    print(
        f"\nthroughput: off {rps_off:.0f} jobs/s, {on_label} {rps_on:.0f} jobs/s: {100 * (1 - rps_on / rps_off):.1f} %"
    )
    pairs = [(a, b) for a in off for b in on if a.round_no == b.round_no]
    print(f"per pair, throughput cost: {spread([100 * (1 - b.rps / a.rps) for a, b in pairs])}")
    # Under this load the bus's own writes (each job's payload) grow the AOF fast enough that Redis rewrites
    # it every few seconds; a rewrite's child takes a core for a large part of a segment, whichever path that
    # segment runs.
    aof_off = [s.aof_bytes for s in off if s.aof_bytes is not None]
    aof_on = [s.aof_bytes for s in on if s.aof_bytes is not None]
    if aof_off and aof_on:
        print(
            f"AOF bytes per job: off {statistics.median(aof_off):.0f}, {on_label} {statistics.median(aof_on):.0f} "
            f"(medians over segments without a rewrite)"
        )
    calm = [(a, b) for a, b in pairs if not a.touched and not b.touched]
    print(
        f"AOF rewrites started while loaded: off {sum(s.started for s in off)}, {on_label} "
        f"{sum(s.started for s in on)}; segments a rewrite ran in: off {sum(s.touched for s in off)}, "
        f"{on_label} {sum(s.touched for s in on)}"
    )
    print(
        f"per pair with no rewrite in either segment ({len(calm)} pairs), throughput cost: "
        f"{spread([100 * (1 - b.rps / a.rps) for a, b in calm]) if len(calm) > 1 else 'too few'}"
    )
    for name in segments[0].cpu_ms:
        off_cpu = statistics.median(s.cpu_ms[name] for s in off)
        on_cpu = statistics.median(s.cpu_ms[name] for s in on)
        print(f"cpu ms per job, {name}: off {off_cpu:.3f}, {on_label} {on_cpu:.3f} ({on_cpu - off_cpu:+.3f})")
    for name in segments[0].threads_ms:
        off_cpu = statistics.median(s.threads_ms[name] for s in off)
        on_cpu = statistics.median(s.threads_ms[name] for s in on)
        print(
            f"cpu ms per job, loaded bridge's {name}: off {off_cpu:.3f}, {on_label} {on_cpu:.3f} "
            f"({on_cpu - off_cpu:+.3f})"
        )
    # The load saturates the shared cores, so the CPU a job costs in all processes bounds jobs/s.
    share = [100 * (1 - sum(a.cpu_ms.values()) / sum(b.cpu_ms.values())) for a, b in pairs]
    print(f"per pair, share of a job's CPU (all processes) that recording takes: {spread(share)}")
    p50_off = statistics.median([v for s in off for v in s.latencies_ms])
    p50_on = statistics.median([v for s in on for v in s.latencies_ms])
    print(f"p50: off {p50_off:.2f} ms, {on_label} {p50_on:.2f} ms ({p50_on - p50_off:+.2f} ms)")
    waiting = [v for s in on for v in s.backlog]
    if waiting and not args.control:
        drains = [s.drain_s for s in on]
        print(
            f"recorder backlog while loaded: median {statistics.median(waiting):.0f}, max {max(waiting)}; "
            f"drained {statistics.median(drains):.2f} s (median) after a segment's last reply"
        )
    all_on = statistics.median(sum(s.cpu_ms.values()) for s in on)
    for phase in phases:
        if phase.recorder_us is not None and phase.recorder_us > 0:
            print(
                f"recorder's writing ({phase.recording_model}): {phase.recorder_us:.1f} us of CPU per record, "
                f"{100 * phase.recorder_us / 1000 / all_on:.1f} % of a job's CPU in all processes"
            )
    print("\ncounts per phase (new snapshots == new inference.served events == jobs answered with recording on):")
    for phase in phases:
        expected = 0 if args.control else phase.answered_on
        expected_off = 0
        ok = (
            phase.new_snapshots_on == expected
            and phase.new_events == expected + expected_off
            and phase.new_snapshots_off == expected_off
        )
        print(
            f"  recording {phase.recording_model}: snapshots {phase.new_snapshots_on}, events {phase.new_events}, "
            f"expected {expected} (events + {expected_off} from the other bridge); the other model's snapshots "
            f"{phase.new_snapshots_off}: "
            f"{'OK' if ok else 'MISMATCH'}"
        )


if __name__ == "__main__":
    main()
