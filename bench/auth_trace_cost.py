"""Authentication and tracing on against both off, at c=64, in one run: the throughput cost (issue 16).

Seeds the demo models and the admin identity into a state folder
(``.examlops/bench-auth-trace`` by default, ``demo.demo_state``, as `exa up`
makes it) and starts two `exa serve start` side by side on it, on free ports:

- on: the defaults, authentication and tracing on (``EXAMLOPS_TRACING__NODE``
  ``bench-on``); the load sends the admin token (``demo.auth_headers``);
- off: ``EXAMLOPS_ENVIRONMENT=development``, ``EXAMLOPS_AUTH__ENABLED=false``,
  ``EXAMLOPS_TRACING__ENABLED=false`` (node ``bench-off``); the load sends no
  token.

``--on auth`` or ``--on tracing`` turns only that one on in the on-server
(the other off, as in the off-server), to tell their costs apart; ``--control``
turns both off in it too: the "cost" it prints is the bench's own bias and
noise, and should be ~0. ``--on-setting EXAMLOPS_NAME=VALUE`` (repeatable) gives the on-server a setting
(the trace writer's ``EXAMLOPS_TRACING__BATCH``, say). Both take the same settings otherwise (``--workers``
predict workers each). The load alternates between them in short segments:
``--requests`` POSTs of JPCP bodies at ``--concurrency`` keep-alive
connections (``loadgen``, a raw asyncio client, so the client is not what is
measured) to ``--path`` (``/v1/models/JPCP/predict`` by default, which records
no drift snapshot, so only authentication and tracing differ;
``/infer-pipeline/infer`` also works). At the 2,500-4,000 req/s seen here a
segment of the default 60,000 requests lasts 15-24 s. The traces not yet written when a segment's load
ends (the batch the writer is filling, up to ``tracing.batch``, and whatever it lags behind) are written
after it, where its req/s does not see them, so short segments understate tracing's cost: the bench prints
them for each on-segment and their median share (a whole batch of 2,048 is 3.4 % of 60,000). A segment of
more requests than ``tracing.bound`` (10,000) also lets the check at the end catch a writer that falls
behind during the load: its queue fills and it drops traces (bench/RESULTS.md).
Each pair of segments (one per server) runs in an order a seeded shuffle picks
(``--seed``), as many pairs of each order as there are pairs, as
``recording_cost.py`` does and for its reason: this machine's speed drifts by
tens of percent over seconds to minutes, so only segments close in time
compare, and many pairs give the figure a spread that says how far it can be
trusted. Before the first pair each server answers ``--warm-up`` untimed
requests (connections, caches, the token's resolution, the trace writer).
After a segment on the on-server the bench waits until its sink has written
a trace for every request (its own ``/metrics`` counters), and after every segment, on either server, it
idles until ``SETTLE_S`` (1.5 s) have passed since the load ended: no tracing work spills into the next
segment, and both sides start a segment after the same pause.

Printed: each segment's req/s, p50 and p99; each pair's cost (1 - on/off req/s)
and over all pairs the mean ± 2 SE (standard error), median, quartiles and
range; the total (all on requests over all on seconds against the same of
off); each segment's server CPU per request (its process and children: predict
workers, trace writer; from the segment's start until its traces are written),
and the median of those on and off, a figure far steadier than req/s when
other work shares the machine; the same for serving's event-loop thread alone (one thread, on a CPU about
95 % of the load: the bound on its throughput) and with its other threads (the trace writer's), per pair
too, and how busy the loop was; each segment's steal (the machine's CPU time
the hypervisor gave to other guests, ``procs.StealMeter``) and the cost again
over the pairs with at most ``--max-steal`` in both segments. Then the check:
the on-server wrote exactly one trace per request it got
(answered ones with outcome ``answered``, under the ``admin`` identity when
authentication is on; none when its tracing is off), the off-server none, and
nobody else any (printed OK or MISMATCH, with the traces the on-server's sink
dropped, from its ``/metrics``). The rows are counted by node in the state
folder's SQL, which both servers share.

    .venv/bin/python bench/auth_trace_cost.py [--requests 60000] [--pairs 8] [--concurrency 64] \
        [--warm-up 500] [--seed 1] [--workers N] [--path /v1/models/JPCP/predict] \
        [--on auth tracing | --control] [--on-setting EXAMLOPS_NAME=VALUE]

Figures only: nothing here asserts anything. Target: a cost of at most 5 % at c=64.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy import func
from sqlmodel import Session, col, select

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo import add_on_setting, auth_headers, demo_state, on_settings
from demo import bodies as demo_bodies
from loadgen import LoadResult, run_load
from procs import CpuMeter, StealMeter, answers, free_port, quantile, start, stop, thread_cpu, wait_until

from examlops.bootstrap import sql_engine
from examlops.core.settings import Settings
from examlops.tracing.sql_store import Trace

NODES = {True: "bench-on", False: "bench-off"}
FEATURES = ("auth", "tracing")
DROPPED = re.compile(r"^examlops_traces_dropped_total ([0-9.e+]+)$", re.MULTILINE)
WRITTEN = re.compile(r"^examlops_traces_written_total ([0-9.e+]+)$", re.MULTILINE)
SETTLE_S = 1.5
"""Idle seconds after every segment, on either server, counted from the end of its load (the on-server's wait
for its traces is part of it): both sides start a segment after the same pause."""


@dataclass
class Segment:
    on: bool
    pair: int
    result: LoadResult
    cpu_s: float
    """CPU seconds the server's process tree spent from the segment's start until its traces were written."""
    steal: float = 0.0
    """The machine's CPU time the hypervisor stole over the segment (``procs.StealMeter``)."""
    loop_s: float = 0.0
    """CPU seconds of the serving process's main thread (its event loop) over the same span as ``cpu_s``."""
    threads_s: float = 0.0
    """CPU seconds of the serving process's other threads (the trace writer's, the token cache's) over it."""
    loop_busy: float = 0.0
    """The share of the load's wall time the event-loop thread was on a CPU."""
    unwritten: int = 0
    """The on-server's traces not yet written (nor dropped) when the segment's load ended: written after it,
    off the clock."""

    @property
    def rps(self) -> float:
        return self.result.rps


@dataclass
class Server:
    on: bool
    url: str
    process: subprocess.Popen[bytes]
    headers: dict[str, str]
    tracing: bool
    requests: int = 0
    answered: int = 0


def pair_orders(pairs: int, seed: int) -> list[tuple[bool, bool]]:
    """Each pair's order (off first or on first): as many of each, shuffled with ``seed``."""
    orders = [(False, True), (True, False)] * (pairs // 2)
    rng = random.Random(seed)
    if pairs % 2:
        orders.append(rng.choice([(False, True), (True, False)]))
    rng.shuffle(orders)
    return orders


def trace_counts(settings: Settings) -> dict[tuple[str, str, str | None], int]:
    """Trace rows by (node, outcome, identity), read from the state folder's SQL."""
    engine = sql_engine(settings)
    try:
        with Session(engine) as session:
            query = select(Trace.node, Trace.outcome, Trace.identity, func.count(col(Trace.trace_id))).group_by(
                col(Trace.node), col(Trace.outcome), col(Trace.identity)
            )
            return {(node, outcome, identity): int(n) for node, outcome, identity, n in session.exec(query)}
    finally:
        engine.dispose()


def sink_counts(server: Server) -> float:
    """The traces the server's sink has written or dropped since it started (its ``/metrics``)."""
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    return sum(float(found.group(1)) for pattern in (WRITTEN, DROPPED) if (found := pattern.search(text)))


def wait_for_traces(server: Server, timeout: float = 60) -> float:
    """Seconds until the server's sink has written (or dropped) a trace for every request it got (0 when
    ``server`` traces nothing); stops early when its count stops growing for 5 s. Read from the server's own
    counters, which start at zero with it: rows an earlier run left in a reused state folder do not count."""
    if not server.tracing:
        return 0.0
    began = time.monotonic()
    last, since = -1.0, began
    while time.monotonic() - began < timeout:
        now = sink_counts(server)
        if now >= server.requests:
            break
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > 5:
            break
        time.sleep(0.05)
    return time.monotonic() - began


def load(server: Server, url_path: str, bodies: list[bytes], total: int, concurrency: int) -> LoadResult:
    result = asyncio.run(
        run_load(
            server.url + url_path,
            lambda i: bodies[i % len(bodies)],
            total=total,
            concurrency=concurrency,
            max_seconds=120,
            headers=server.headers,
        )
    )
    server.requests += sum(result.statuses.values())
    server.answered += result.statuses.get(200, 0)
    return result


def dropped(server: Server) -> float:
    found = DROPPED.search(httpx.get(f"{server.url}/metrics", timeout=5).text)
    return float(found.group(1)) if found else float("nan")


def start_server(
    home: Path,
    on: bool,
    features: set[str],
    headers: dict[str, str],
    workers: int | None,
    settings: dict[str, str] | None = None,
) -> Server:
    """A serving process on a free port with ``features`` (of ``FEATURES``) on, the others off; the load to it
    sends ``headers`` when authentication is on. ``settings``: more ``EXAMLOPS_*`` variables for it."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXAMLOPS_")}
    env |= settings or {}
    env |= {"EXAMLOPS_HOME": str(home), "EXAMLOPS_SERVING__PORT": str(port), "EXAMLOPS_TRACING__NODE": NODES[on]}
    if workers is not None:
        env["EXAMLOPS_PREDICT__WORKERS"] = str(workers)
    if "auth" not in features:
        env |= {"EXAMLOPS_ENVIRONMENT": "development", "EXAMLOPS_AUTH__ENABLED": "false"}
    if "tracing" not in features:
        env["EXAMLOPS_TRACING__ENABLED"] = "false"
    name = "on" if on else "off"
    process = start([sys.executable, "-m", "examlops.cli.main", "serve", "start"], env, home / f"serving-{name}.log")
    server = Server(
        on, f"http://127.0.0.1:{port}", process, headers if "auth" in features else {}, "tracing" in features
    )
    try:
        wait_until(answers(f"{server.url}/readyz"), f"the {name} server (see {home}/serving-{name}.log)", proc=process)
    except BaseException:
        stop(process)
        raise
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=60_000, help="Requests per segment.")
    parser.add_argument("--pairs", type=int, default=8, help="On/off pairs of segments.")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--warm-up", type=int, default=500, help="Untimed requests to each server first.")
    parser.add_argument("--seed", type=int, default=1, help="Seeds the order of the pairs (printed).")
    parser.add_argument("--workers", type=int, help="Predict workers of each server (default: the settings').")
    parser.add_argument("--path", default="/v1/models/JPCP/predict", help="The route the load posts to.")
    parser.add_argument(
        "--on", nargs="+", choices=FEATURES, default=list(FEATURES), help="What the on-server has on (default: both)."
    )
    parser.add_argument(
        "--max-steal", type=float, default=0.05, help="Pairs past this steal share are left out of a second figure."
    )
    parser.add_argument("--control", action="store_true", help="Both servers with both off: the bench's bias.")
    add_on_setting(parser, "on-server")
    parser.add_argument("--home", type=Path, default=Path(".examlops/bench-auth-trace"))
    args = parser.parse_args()
    features = set() if args.control else set(args.on)
    if args.pairs < 1 or args.requests < 1:
        parser.error("--pairs and --requests must be at least 1")
    settings_on = on_settings(parser, args)

    home = args.home.resolve()
    settings, catalog = demo_state(home)
    headers = auth_headers(settings)
    before = trace_counts(settings)
    extra = {"model": "JPCP"} if args.path.startswith("/infer-pipeline") else {}
    bodies = [json.dumps(b | extra).encode() for b in demo_bodies(catalog.get("JPCP").embedding_dim, 1000, seed=5)]

    servers: dict[bool, Server] = {}
    segments: list[Segment] = []
    try:
        # One after the other: both seed the task map in the shared SQL at start.
        for on in (True, False):
            servers[on] = start_server(
                home, on, features if on else set(), headers, args.workers, settings_on if on else None
            )
        for on in (True, False):
            load(servers[on], args.path, bodies, args.warm_up, args.concurrency)
        wait_for_traces(servers[True])
        meter = CpuMeter({str(on): server.process.pid for on, server in servers.items()})
        for pair, order in enumerate(pair_orders(args.pairs, args.seed)):
            for on in order:
                pid = servers[on].process.pid
                cpu_before, threads_before, steal = meter.read()[str(on)], thread_cpu(pid), StealMeter()
                result = load(servers[on], args.path, bodies, args.requests, args.concurrency)
                ended, threads_loaded = time.monotonic(), thread_cpu(pid)
                unwritten = int(servers[on].requests - sink_counts(servers[on])) if servers[on].tracing else 0
                drain = wait_for_traces(servers[on])
                cpu_s = meter.read()[str(on)] - cpu_before
                threads_after = thread_cpu(pid)
                seg = Segment(
                    on,
                    pair,
                    result,
                    cpu_s,
                    steal.share(),
                    threads_after["main"] - threads_before["main"],
                    threads_after["threads"] - threads_before["threads"],
                    (threads_loaded["main"] - threads_before["main"]) / max(1e-9, result.seconds),
                    unwritten,
                )
                time.sleep(max(0.0, SETTLE_S - (time.monotonic() - ended)))
                segments.append(seg)
                print(
                    f"pair {pair + 1:>2} {'on ' if on else 'off'}: {result.rps:7.0f} req/s, p50 {result.p50:6.2f} ms, "
                    f"p99 {result.p99:6.2f} ms, errors {result.errors}, {cpu_us(seg):.0f} µs CPU/request "
                    f"({per_request(seg, seg.loop_s):.0f} loop, busy {seg.loop_busy:.0%}), steal {seg.steal:.0%}"
                    + (
                        f", {unwritten} traces unwritten at its end, written in {drain:.2f} s"
                        if servers[on].tracing
                        else ""
                    ),
                    flush=True,
                )
        drops = dropped(servers[True]) if servers[True].tracing else 0.0
    finally:
        for server in servers.values():
            stop(server.process)
    report(args, segments, servers, before, trace_counts(settings), drops)


def cpu_us(segment: Segment) -> float:
    """The server's CPU microseconds per request of the segment (its process and children: predict workers,
    trace writer)."""
    return per_request(segment, segment.cpu_s)


def per_request(segment: Segment, seconds: float) -> float:
    return 1e6 * seconds / max(1, segment.result.sent)


def loop_report(on: list[Segment], off: list[Segment]) -> None:
    """What the serving process's own threads spent per request: the event loop (one thread: the bound on
    throughput while it is busy most of the load) and the others (the trace writer hands batches to its
    child from one, holding the GIL the loop needs while it pickles)."""
    for name, of in (
        ("event-loop thread", lambda s: s.loop_s),
        ("event-loop and other threads", lambda s: s.loop_s + s.threads_s),
    ):
        costs = [100 * (per_request(b, of(b)) / per_request(a, of(a)) - 1) for a in off for b in on if a.pair == b.pair]
        median_on = statistics.median(per_request(s, of(s)) for s in on)
        median_off = statistics.median(per_request(s, of(s)) for s in off)
        print(
            f"serving's {name}, CPU per request: off {median_off:.0f} µs, on {median_on:.0f} µs (medians); "
            f"per pair, on/off - 1: {spread(costs)}"
        )
    busy = statistics.median(s.loop_busy for s in [*on, *off])
    print(f"the event-loop thread was on a CPU {busy:.0%} of the load's time (median of segments)")


def spread(costs: list[float]) -> str:
    mean = statistics.fmean(costs)
    se = statistics.stdev(costs) / math.sqrt(len(costs)) if len(costs) > 1 else float("nan")
    quartiles = statistics.quantiles(costs, n=4) if len(costs) >= 4 else [min(costs), 0.0, max(costs)]
    return (
        f"mean {mean:.1f} % ± {2 * se:.1f} (2 SE), median {statistics.median(costs):.1f} %, "
        f"quartiles {quartiles[0]:.1f} / {quartiles[2]:.1f} %, range {min(costs):.1f} to {max(costs):.1f} %"
    )


def report(
    args: argparse.Namespace,
    segments: list[Segment],
    servers: dict[bool, Server],
    before: dict[tuple[str, str, str | None], int],
    after: dict[tuple[str, str, str | None], int],
    drops: float,
) -> None:
    print(
        f"\n{args.requests} requests per segment to POST {args.path} at c={args.concurrency}, after "
        f"{args.warm_up} untimed per server; {args.pairs} on/off pairs, order seed {args.seed}; {os.cpu_count()} cores"
    )
    served_on, served_off = servers[True], servers[False]
    authenticated = bool(served_on.headers)
    said = [
        name
        for name, is_on in (("authentication (admin token)", authenticated), ("tracing", served_on.tracing))
        if is_on
    ]
    if not said:
        print("CONTROL RUN: the on-server has authentication and tracing off too; any cost below is the bench's bias")
    print(f"on: {' and '.join(said) or 'nothing'}; off: development, authentication and tracing disabled\n")
    header = f"{'seg':<4} {'pair':>4} {'side':<4} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'errors':>6}"
    print(f"{header} {'CPU µs/req':>10} {'loop':>5} {'other':>5} {'busy':>5} {'steal':>5}")
    for i, seg in enumerate(segments):
        r = seg.result
        side = "on" if seg.on else "off"
        print(
            f"{i + 1:<4} {seg.pair + 1:>4} {side:<4} {r.rps:>7.0f} {r.p50:>7.2f} {r.p99:>7.2f} {r.errors:>6} "
            f"{cpu_us(seg):>10.0f} {per_request(seg, seg.loop_s):>5.0f} {per_request(seg, seg.threads_s):>5.0f} "
            f"{seg.loop_busy:>5.0%} {seg.steal:>5.0%}"
        )
    on = [s for s in segments if s.on]
    off = [s for s in segments if not s.on]
    costs = [100 * (1 - b.rps / a.rps) for a in off for b in on if a.pair == b.pair]
    print(f"\nper pair, throughput cost (1 - on/off): {spread(costs)}")
    calm = [
        100 * (1 - b.rps / a.rps)
        for a in off
        for b in on
        if a.pair == b.pair and max(a.steal, b.steal) <= args.max_steal
    ]
    if calm:
        print(f"pairs with steal <= {args.max_steal:.0%} in both segments ({len(calm)}): {spread(calm)}")
    rps_on = sum(s.result.sent for s in on) / sum(s.result.seconds for s in on)
    rps_off = sum(s.result.sent for s in off) / sum(s.result.seconds for s in off)
    print(f"total: off {rps_off:.0f} req/s, on {rps_on:.0f} req/s: {100 * (1 - rps_on / rps_off):.1f} %")
    if served_on.tracing:
        late = statistics.median(100 * s.unwritten / max(1, s.result.sent) for s in on)
        print(
            f"traces unwritten when an on-segment's load ended (written after it, off the clock): median {late:.1f} % "
            f"of the segment's, at most {max(s.unwritten for s in on)}"
        )
    cpu_on = statistics.median(cpu_us(s) for s in on)
    cpu_off = statistics.median(cpu_us(s) for s in off)
    print(
        f"server CPU per request (process and children, median of segments): off {cpu_off:.0f} µs, "
        f"on {cpu_on:.0f} µs: {100 * (cpu_on / cpu_off - 1):+.1f} %"
    )
    loop_report(on, off)
    p50_on = statistics.median(v for s in on for v in s.result.latencies_ms)
    p50_off = statistics.median(v for s in off for v in s.result.latencies_ms)
    p99_on = quantile([v for s in on for v in s.result.latencies_ms], 0.99)
    p99_off = quantile([v for s in off for v in s.result.latencies_ms], 0.99)
    print(f"p50: off {p50_off:.2f} ms, on {p50_on:.2f} ms; p99: off {p99_off:.2f} ms, on {p99_on:.2f} ms")

    new = {key: after.get(key, 0) - before.get(key, 0) for key in after}
    new = {key: n for key, n in new.items() if n}
    on_node, off_node = NODES[True], NODES[False]
    on_total = sum(n for (node, _, _), n in new.items() if node == on_node)
    on_answered = sum(
        n
        for (node, outcome, identity), n in new.items()
        if node == on_node and outcome == "answered" and (identity == "admin" or not authenticated)
    )
    off_total = sum(n for (node, _, _), n in new.items() if node == off_node)
    others = sum(n for (node, _, _), n in new.items() if node not in NODES.values())
    expected, expected_answered = (served_on.requests, served_on.answered) if served_on.tracing else (0, 0)
    ok = on_total == expected and on_answered == expected_answered and off_total == 0 and others == 0
    print(
        f"\ntraces (new rows in SQL by node, outcome, identity): "
        f"{ {'/'.join(str(k) for k in key): n for key, n in sorted(new.items(), key=str)} }"
    )
    as_whom = " as admin" if authenticated else ""
    print(
        f"on-server: {served_on.requests} requests ({served_on.answered} answered), {on_total} traces "
        f"({on_answered} answered{as_whom}), {drops:.0f} dropped by its sink; off-server: {served_off.requests} "
        f"requests, {off_total} traces; other nodes: {others} traces: {'OK' if ok else 'MISMATCH'}"
    )


if __name__ == "__main__":
    main()
