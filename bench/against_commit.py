"""Bus throughput of this checkout against an earlier commit's, from two worktrees, interleaved.

Runs ``bench/bus_vs_http.py`` of each worktree in turn (base, this, base, this, ...), one round at one
concurrency each time, each with its own virtualenv and a fresh state folder, and reads the JSON line the
bench prints. Printed: each run's bus req/s and CPU ms per job of each process (bridge, serving with its
pool workers, Redis, the client), the medians, and this checkout's median as a ratio of the base's. A slow
spell of the shared machine lands on both sides, as the runs alternate; CPU per job moves less with it
than req/s does, and names the process that costs more.

    git worktree add --detach ../base f678778 && make -C ../base setup
    .venv/bin/python bench/against_commit.py --base ../base [--pairs 3] [--requests 1000] [--concurrency 32]

Figures only: nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def bus_run(worktree: Path, requests: int, concurrency: int) -> tuple[float, dict[str, float]]:
    """One run of the worktree's bus_vs_http.py; the req/s of its first bus path and its CPU ms per job."""
    with tempfile.TemporaryDirectory(prefix="against-commit-") as home:
        argv = [
            str(worktree / ".venv" / "bin" / "python"),
            str(worktree / "bench" / "bus_vs_http.py"),
            "--requests", str(requests), "--rounds", "1", "--concurrency", str(concurrency),
            "--home", str(Path(home) / "state"),
        ]  # fmt: skip
        # The worktree's own code first: a virtualenv shared between worktrees has one editable install.
        env = os.environ | {"PYTHONPATH": str(worktree)}
        done = subprocess.run(argv, cwd=worktree, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.exit(f"{worktree}: bus_vs_http.py failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    figures = json.loads(lines[-1])
    [bus] = [name for name in figures if name.startswith("bus")][:1]
    return float(figures[bus]["rps"]), {k: float(v) for k, v in figures[bus].get("cpu_ms_per_job", {}).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True, help="worktree of the earlier commit, set up")
    parser.add_argument("--pairs", type=int, default=3, help="base/this pairs of runs")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    base_commit = subprocess.run(
        ["git", "-C", str(args.base), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    runs: dict[str, list[float]] = {"base": [], "this": []}
    cpu: dict[str, dict[str, list[float]]] = {"base": {}, "this": {}}
    for pair in range(1, args.pairs + 1):
        for side, tree in (("base", args.base.resolve()), ("this", HERE)):
            rps, per_job = bus_run(tree, args.requests, args.concurrency)
            runs[side].append(rps)
            for process, ms in per_job.items():
                cpu[side].setdefault(process, []).append(ms)
            spent = "  ".join(f"{process} {ms:.3f}" for process, ms in per_job.items())
            print(f"pair {pair}/{args.pairs} {side:>4}: {rps:7.0f} req/s  cpu ms per job: {spent}", flush=True)
    base, this = statistics.median(runs["base"]), statistics.median(runs["this"])
    print(f"\nc={args.concurrency}, {args.requests} requests a run, {args.pairs} interleaved pairs")
    print(f"median bus req/s: base {base_commit} {base:.0f}, this checkout {this:.0f}; ratio {this / base:.2f}")
    print("median CPU ms per job (base -> this checkout):")
    for process in dict.fromkeys([*cpu["base"], *cpu["this"]]):
        then, now = (statistics.median(cpu[side].get(process) or [float("nan")]) for side in ("base", "this"))
        print(f"  {process:<8} {then:.3f} -> {now:.3f} ({now - then:+.3f})")


if __name__ == "__main__":
    main()
