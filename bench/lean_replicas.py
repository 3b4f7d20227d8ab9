"""Start-up and idle memory of one serving replica: `exa serve start` beside `mlflow models serve`, in one run.

The same model version (JPCP v1, HistGradientBoosting, tensor signature), four workers each
(`EXAMLOPS_PREDICT__WORKERS=4`, `mlflow models serve -w 4`), every server pinned to one core. For each
round the two start one after the other (the order alternates between rounds), each alone on its core:
ready is the time from the command to the first 200 of its readiness route (`/readyz`, `/ping`). Once
both are up and idle, the memory of each process tree: PSS summed (what the tree really costs: a page
shared by several processes is split between them) and RSS summed (counts shared pages once per process).
Then the same 64 rows to both: the predictions must match.

`exa serve start` serves a catalog of JPCP alone (`--catalog jpcp`, the default: one model, as MLflow serves)
or the three demo models (`--catalog demo`).

    .venv/bin/python bench/lean_replicas.py [--rounds 2] [--catalog jpcp] [--home .examlops/bench-lean]

Figures only: nothing here asserts anything but equal predictions.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo import admin_token, demo_state
from procs import answers, free_port, start, stop, wait_until

BIN = Path(sys.executable).parent
CORE = 0
WORKERS = 4


@dataclass(frozen=True)
class Started:
    name: str
    proc: subprocess.Popen[bytes]
    url: str
    ready_s: float


@dataclass(frozen=True)
class Memory:
    processes: int
    pss_mb: float
    rss_mb: float


def tree_memory(pid: int) -> Memory:
    """PSS and RSS summed over ``pid`` and every descendant (``taskset`` execs the server: same pid)."""
    root = psutil.Process(pid)
    pss = rss = 0
    count = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            info = proc.memory_full_info()
        except psutil.Error:
            continue
        pss, rss, count = pss + info.pss, rss + info.rss, count + 1
    return Memory(count, pss / 2**20, rss / 2**20)


def environment(home: Path, tracking_uri: str, catalog: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXAMLOPS_")}
    env |= {"EXAMLOPS_HOME": str(home), "MLFLOW_TRACKING_URI": tracking_uri, "MLFLOW_DISABLE_TELEMETRY": "true"}
    env |= {"EXAMLOPS_PREDICT__WORKERS": str(WORKERS), "EXAMLOPS_HOTSET__RELOAD_POLL_S": "0"}
    if catalog == "jpcp":
        only = home / "catalog-jpcp"
        only.mkdir(exist_ok=True)
        shutil.copy(Path(__file__).resolve().parents[1] / "examlops" / "catalog" / "jpcp.yaml", only)
        env["EXAMLOPS_CATALOG_DIR"] = str(only)
    # Serve this checkout's code, not whichever one the virtualenv's editable install points at.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH")]))
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # `mlflow models serve` runs `uvicorn` from PATH
    return env


def start_ours(home: Path, env: dict[str, str], port: int) -> Started:
    argv = [str(BIN / "exa"), "serve", "start", "--port", str(port)]
    began = time.monotonic()
    proc = start(argv, env, home / f"ours-{port}.log", core=CORE)
    url = f"http://127.0.0.1:{port}"
    wait_until(answers(f"{url}/readyz"), "exa serve start", proc=proc, timeout=240)
    return Started("exa serve start", proc, url, time.monotonic() - began)


def start_theirs(home: Path, env: dict[str, str], port: int) -> Started:
    argv = [str(BIN / "mlflow"), "models", "serve", "-m", "models:/JPCP/1", "-h", "127.0.0.1", "-p", str(port)]
    argv += ["-w", str(WORKERS), "--env-manager", "local"]
    began = time.monotonic()
    proc = start(argv, env, home / f"mlflow-serve-{port}.log", core=CORE)
    url = f"http://127.0.0.1:{port}"
    wait_until(answers(f"{url}/ping"), "mlflow models serve", proc=proc, timeout=240)
    return Started("mlflow models serve", proc, url, time.monotonic() - began)


def same_predictions(ours: Started, theirs: Started, token: str) -> float:
    """The largest difference between the two servers' predictions for the same 64 rows."""
    rng = np.random.default_rng(7)
    rows = rng.normal(0, 0.05, (64, 384)).round(6)
    headers = {"Authorization": f"Bearer {token}"}
    mine = [
        httpx.post(
            f"{ours.url}/v1/models/JPCP/predict",
            json={"embedding": row.tolist(), "node_count": 12},
            headers=headers,
            timeout=30,
        ).json()["prediction"]
        for row in rows
    ]
    tensor = np.hstack([rows, np.full((64, 1), 12.0)]).tolist()
    reply = httpx.post(
        f"{theirs.url}/invocations",
        content=json.dumps({"inputs": tensor}),
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    reply.raise_for_status()
    body = reply.json()
    theirs_values = np.asarray(body["predictions"] if isinstance(body, dict) else body, dtype=np.float64).reshape(-1)
    difference = float(np.max(np.abs(np.asarray(mine) - theirs_values)))
    if difference > 1e-9:
        raise SystemExit(f"the predictions differ by up to {difference}")
    return difference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="start-ups of each server (the order alternates)")
    parser.add_argument("--catalog", choices=("jpcp", "demo"), default="jpcp", help="what exa serve start serves")
    parser.add_argument("--idle-s", type=float, default=5.0, help="seconds both stay idle before memory is read")
    parser.add_argument("--home", type=Path, default=Path(".examlops/bench-lean"), help="state folder of the bench")
    args = parser.parse_args()

    home = args.home.resolve()
    if home.exists():
        shutil.rmtree(home)
    print(f"seeding demo models in {home} ...", flush=True)
    settings, _ = demo_state(home)
    env = environment(home, settings.mlflow_tracking_uri, args.catalog)
    rows: list[tuple[int, Started, Memory, Started, Memory]] = []
    for round_ in range(args.rounds):
        starters = [("ours", start_ours), ("theirs", start_theirs)]
        if round_ % 2:
            starters.reverse()
        started: dict[str, Started] = {}
        try:
            for name, starter in starters:
                started[name] = starter(home, env, free_port())
                print(f"round {round_ + 1}: {started[name].name} ready in {started[name].ready_s:.1f} s", flush=True)
            time.sleep(args.idle_s)
            ours_memory, theirs_memory = tree_memory(started["ours"].proc.pid), tree_memory(started["theirs"].proc.pid)
            same_predictions(started["ours"], started["theirs"], admin_token(settings))
            rows.append((round_ + 1, started["ours"], ours_memory, started["theirs"], theirs_memory))
        finally:
            for one in started.values():
                stop(one.proc)

    print()
    print(f"one core each (core {CORE}), {WORKERS} workers each, JPCP v1; exa serve start catalog: {args.catalog}")
    header = f"{'round':>5} | {'server':<20} | {'ready s':>8} | {'procs':>5} | {'PSS MB':>8} | {'RSS MB':>8}"
    print(header)
    print("-" * len(header))
    for round_, ours, ours_memory, theirs, theirs_memory in rows:
        for one, memory in ((ours, ours_memory), (theirs, theirs_memory)):
            print(
                f"{round_:>5} | {one.name:<20} | {one.ready_s:>8.1f} | {memory.processes:>5} | "
                f"{memory.pss_mb:>8.0f} | {memory.rss_mb:>8.0f}"
            )
        print(
            f"{round_:>5} | {'ratio ours/mlflow':<20} | {ours.ready_s / theirs.ready_s:>8.2f} | {'':>5} | "
            f"{ours_memory.pss_mb / theirs_memory.pss_mb:>8.2f} | {ours_memory.rss_mb / theirs_memory.rss_mb:>8.2f}"
        )
    print("targets: ready within 1.5x of mlflow models serve, idle memory at most 2x; predictions equal (64 rows)")


if __name__ == "__main__":
    main()
