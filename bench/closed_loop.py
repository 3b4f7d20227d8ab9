"""The closed loop end to end (issue 20's must-hold): a failure burst on Production is answered by a retrain,
a canary analysis and a promotion on every serving instance, unattended; or, with ``--worse-candidate``, a
worse candidate is rejected by its canary analysis and Production is left alone.

Starts the platform on a fresh state folder (``--home``, default ``.examlops/bench-closed-loop``; wiped
first, only if this bench made it) with `exa up` and a second serving instance (``closed_loop_platform``;
``EXAMLOPS_SERVING__INSTANCES`` names both, so every promotion reloads and confirms both), with shortened
windows (``WINDOWS``: the canary window at least 30 s and 60 Canary calls, a 2 s poll, a 2 s traffic rules
cache). Then steady traffic to JPCP's default alias, ``--bus-rate`` signed bus jobs and ``--http-rate``
direct HTTP calls a second over both instances (``closed_loop_traffic``), and after ``--steady`` seconds:

- default mode, the burst: `exa promote JPCP --alias Production --version N`, N the demo's failing version
  (alias Staging after the demo seed): an operator deploys a bad version. Every call to Production then
  fails (``inference_failed``); the bridge's failure trigger asks Prefect for a retrain; the retrain run
  puts a better candidate on Canary and its canary-analysis subflow promotes it to Production on every
  instance. Must hold: from the burst start to the candidate serving as Production on every instance in
  under 5 minutes (``--bound``); 0 requests lost; every failure an ``inference_failed`` of the failing
  version (its trace names the version).
- ``--worse-candidate``: `exa retrain JPCP --via-prefect --shift 3 --seed 12`, a candidate trained on shifted
  data. At this seed it beats Production on its own shifted holdout, so it reaches Canary; on the live,
  unshifted traffic its predictions differ from Production's, so the analysis's drift gate fails it (the
  check behind the seed is in bench/RESULTS.md, issue 20). Must hold: the analysis decides
  ``fail``; Canary's share is 0 on every instance; Production is the version it was, on every instance,
  all along; no call is served by the candidate once the rejection reached the rules caches; 0 requests
  lost, 0 failed.

Prints the timeline (seconds from the burst, or the operator's retrain, start), the totals and a PASS/FAIL
line per bound; exits 1 when a bound failed. The run is bounded (``--max-wait`` after the start; the
platform's start-up has its own limit) and stops every process it started, on Ctrl-C or an error too.

    .venv/bin/python bench/closed_loop.py [--worse-candidate] [--bus-rate 20] [--http-rate 10] [--steady 20]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from closed_loop_platform import Platform, instance_versions
from closed_loop_report import Bounds, Timeline, Totals
from closed_loop_scenes import burst_report, worse_report
from closed_loop_traffic import Call, Traffic, versions_of_traces
from closed_loop_watch import Watch
from demo import auth_headers

from examlops.bootstrap.serving import catalog, model_registry

MODEL = "JPCP"
FINAL = ("serving", "promoted", "rejected", "rolled_back", "undecided", "aborted")
"""Where a loop ends (``serving``: the candidate was kept back)."""
WINDOWS = {
    "EXAMLOPS_LOOP__MIN_SECONDS": "30",
    "EXAMLOPS_LOOP__MIN_REQUESTS": "60",
    "EXAMLOPS_LOOP__MAX_SECONDS": "150",
    "EXAMLOPS_LOOP__POLL_S": "2",
    "EXAMLOPS_LOOP__CANARY_SHARE": "10",
    "EXAMLOPS_TRAFFIC__RULES_TTL_S": "2",
    "EXAMLOPS_FAILURE__WINDOW": "50",
    "EXAMLOPS_HOTSET__RELOAD_POLL_S": "5",
    "EXAMLOPS_PREDICT__WORKERS": "2",
}
"""Shortened windows for every process of the platform (the defaults are minutes)."""


def _interrupted(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def wait_for(until: float, done: Any) -> float | None:
    """Poll until ``done()`` holds (the time) or ``until`` passes (None)."""
    while time.time() < until:
        if done():
            return time.time()
        time.sleep(0.5)
    return None


def save_calls(path: Path, calls: list[Call], traces: dict[str, str | None]) -> None:
    """One JSON line per request (a failed one with the version its trace names), for a closer look."""
    with path.open("w") as out:
        for call in calls:
            row = asdict(call) | ({"trace_version": traces.get(call.trace)} if call.trace in traces else {})
            out.write(json.dumps(row) + "\n")


def run(args: argparse.Namespace) -> bool:
    platform = Platform(args.home.resolve(), WINDOWS, instances=args.instances)
    traffic: Traffic | None = None
    watch: Watch | None = None
    try:
        took = platform.start()
        settings = platform.settings
        print(f"platform up in {took:.0f} s: serving at {', '.join(platform.urls)} (state folder {platform.home})")
        headers = auth_headers(settings)
        spec = catalog(settings).get(MODEL)
        registry = model_registry(settings)
        before = {alias: registry.resolve(MODEL, alias).version for alias in ("Production", "Canary", "Staging")}
        print(f"{MODEL} before: " + ", ".join(f"{alias} v{version}" for alias, version in before.items())
              + f"; instances: {instance_versions(platform.urls, headers, MODEL)}")  # fmt: skip
        watch = Watch(settings, platform.urls, headers, MODEL)
        watch.start()
        traffic = Traffic(settings, platform.urls, headers, MODEL, bus_rate=args.bus_rate, http_rate=args.http_rate,
                          dim=spec.embedding_dim)  # fmt: skip
        traffic.start(str(spec.seanerbus_uuid))
        print(f"steady traffic: {args.bus_rate:g} bus jobs/s + {args.http_rate:g} HTTP calls/s for {args.steady:g} s")
        time.sleep(args.steady)

        t0 = time.time()
        if args.worse_candidate:
            command = ["retrain", MODEL, "--via-prefect", "--shift", str(args.shift), "--seed", str(args.seed)]
        else:
            command = ["promote", MODEL, "--alias", "Production", "--version", before["Staging"]]
        print(f"t0: exa {' '.join(command)}", flush=True)
        done_cmd = platform.exa(*command)
        t_cmd = time.time()
        if done_cmd.returncode != 0:
            print(f"exa {command[0]} failed ({done_cmd.returncode}): {done_cmd.stdout}{done_cmd.stderr}")

        def finished() -> bool:
            retrained = watch.first("phase", "loop", lambda phase: phase == "retraining", after=t0)
            if retrained is None or watch.now("phase", "loop") not in FINAL:
                return False
            if args.worse_candidate:
                return True
            promoted = registry.resolve(MODEL, "Production").version
            return promoted not in (before["Production"], before["Staging"]) and all(
                watch.now("serving", f"{url} Production") == promoted for url in platform.urls
            )

        ended = wait_for(t0 + args.max_wait, finished)
        print(f"loop {'ended' if ended else 'did not end'} after {time.time() - t0:.0f} s; "
              f"{args.tail:g} s more traffic", flush=True)  # fmt: skip
        time.sleep(args.tail)
        traffic.stop(grace_s=35)
        watch.stop()
        after = {alias: registry.resolve(MODEL, alias).version for alias in ("Production", "Canary")}
        failed = [call.trace for call in traffic.calls if call.outcome == "failed" and call.trace]
        traces = versions_of_traces(settings, failed)
        totals = Totals.of(traffic.calls, traces)
        save_calls(platform.home / "bench-calls.jsonl", traffic.calls, traces)
        timeline = Timeline(t0, "the operator's retrain" if args.worse_candidate else "the burst start")
        bounds = Bounds()
        timeline.mark(t0, f"exa {' '.join(command)} started")
        timeline.mark(t_cmd, f"exa {command[0]} returned ({done_cmd.returncode})")
        scene = worse_report if args.worse_candidate else burst_report
        scene(args, settings, platform.urls, watch, traffic.calls, before, after, timeline, bounds)
        timeline.print()
        totals.print()
        lost = sum(totals.lost.values())
        bounds.check("0 requests lost", lost == 0, f"{lost} of {totals.sent}")
        if args.worse_candidate:
            bounds.check("0 requests failed", totals.sent - totals.answered - lost == 0,
                         f"{totals.sent - totals.answered - lost} failed")  # fmt: skip
        else:
            wrong = totals.not_from(before["Staging"])
            bounds.check("failures only the failing model's", wrong == 0,
                         f"{wrong} failures not an inference_failed of v{before['Staging']}")  # fmt: skip
        if traffic.error is not None:
            bounds.check("the load ran to the end", False, repr(traffic.error))
        print(f"watch polls that failed: {watch.errors}; load {args.bus_rate:g} bus/s + {args.http_rate:g} HTTP/s; "
              f"{len(platform.urls)} serving instances")  # fmt: skip
        print(f"every request: {platform.home / 'bench-calls.jsonl'}")
        bounds.print()
        return bounds.held
    finally:
        if traffic is not None:
            traffic.stop(grace_s=0)
        if watch is not None:
            watch.stop()
        stopping = time.monotonic()
        platform.stop()
        print(f"stopped every process in {time.monotonic() - stopping:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worse-candidate", action="store_true", help="Retrain a worse candidate instead of a burst.")
    parser.add_argument("--home", type=Path, default=Path(".examlops/bench-closed-loop"))
    parser.add_argument("--instances", type=int, default=2, help="Serving instances.")
    parser.add_argument("--bus-rate", type=float, default=20.0, help="Bus jobs a second.")
    parser.add_argument("--http-rate", type=float, default=10.0, help="HTTP calls a second, over the instances.")
    parser.add_argument("--steady", type=float, default=20.0, help="Seconds of traffic before the burst.")
    parser.add_argument("--tail", type=float, default=10.0, help="Seconds of traffic after the loop ended.")
    parser.add_argument("--max-wait", type=float, default=300.0, help="Seconds the loop gets after the burst.")
    parser.add_argument("--bound", type=float, default=300.0, help="Must hold: burst to new Production, seconds.")
    parser.add_argument("--shift", type=float, default=3.0, help="--worse-candidate: the training data's shift.")
    parser.add_argument("--seed", type=int, default=12, help="--worse-candidate: the retrain's seed.")
    args = parser.parse_args()
    args.model = MODEL
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored (`cmd &`)
    began = time.monotonic()
    try:
        held = run(args)
    except KeyboardInterrupt:
        print(f"interrupted after {time.monotonic() - began:.0f} s: every process it started was stopped")
        sys.exit(130)
    print(f"the whole run took {time.monotonic() - began:.0f} s")
    sys.exit(0 if held else 1)


if __name__ == "__main__":
    main()
