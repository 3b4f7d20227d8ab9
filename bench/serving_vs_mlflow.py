"""Serving throughput and latency: `exa serve start` beside `mlflow models serve`, in one run.

Both servers are pinned to core 0 and the load generator to core 1. For each
concurrency the two take turns on the same bounded count of requests for the
same model version (JPCP v1, tensor signature). The in-process limit is the
model's own predict on batches of 32 rows on core 0.

    .venv/bin/python bench/serving_vs_mlflow.py [--requests 3000] [--home .examlops/bench]

Figures only: nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo import admin_token, demo_state
from loadgen import LoadResult, run_load
from procs import answers, start, stop, wait_until

from examlops.core.settings import Settings

BIN = Path(sys.executable).parent
SERVER_CORE, CLIENT_CORE = 0, 1


def in_process_limit(settings: Settings) -> float:
    """Rows per second of the model's own predict on batches of 32, on the server's core."""
    from examlops.bootstrap import model_registry
    from examlops.registry.loader import load_sklearn_model

    registry = model_registry(settings)
    model = load_sklearn_model(registry.fetch(registry.resolve("JPCP", "Production")))
    rows = np.random.default_rng(0).normal(0, 0.05, (32, 385))
    rows[:, -1] = 12
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {SERVER_CORE})
    try:
        model.predict(rows)
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < 2.0:
            model.predict(rows)
            count += 32
        return count / (time.perf_counter() - started)
    finally:
        os.sched_setaffinity(0, before)


def admin_headers(settings: Settings, content_type: str = "application/json") -> dict[str, str]:
    """Request headers of the admin identity ``start_pair`` provisioned."""
    return {"Content-Type": content_type, "Authorization": f"Bearer {admin_token(settings)}"}


def start_pair(
    home: Path, ours_port: int, theirs_port: int, model_uri: str = "models:/JPCP/1"
) -> tuple[Settings, subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """A fresh ``home`` with the demo models and the admin identity (``admin_headers`` authenticate as it),
    then `exa serve start` and `mlflow models serve` of ``model_uri`` (tensor signature) on ``SERVER_CORE``,
    both answering. The caller stops both (``procs.stop``)."""
    if home.exists():
        shutil.rmtree(home)
    print(f"seeding demo models in {home} ...", flush=True)
    settings, _ = demo_state(home)  # the demo models, the SQL schema serving needs, the admin identity
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXAMLOPS_")}
    env |= {"EXAMLOPS_HOME": str(home), "MLFLOW_TRACKING_URI": settings.mlflow_tracking_uri}
    # Serve this checkout's code, not whichever one the virtualenv's editable install points at.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH")]))
    # `mlflow models serve` runs `uvicorn` from PATH.
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    ours = start(
        [str(BIN / "exa"), "serve", "start", "--port", str(ours_port)], env, home / "ours.log", core=SERVER_CORE
    )
    theirs = start(
        [
            str(BIN / "mlflow"),
            "models",
            "serve",
            "-m",
            model_uri,
            "-h",
            "127.0.0.1",
            "-p",
            str(theirs_port),
            "--env-manager",
            "local",
        ],
        env,
        home / "mlflow-serve.log",
        core=SERVER_CORE,
    )
    try:
        ours_start = wait_until(answers(f"http://127.0.0.1:{ours_port}/readyz"), "examlops", proc=ours)
        theirs_start = wait_until(answers(f"http://127.0.0.1:{theirs_port}/ping"), "mlflow models serve", proc=theirs)
    except BaseException:
        stop(ours)
        stop(theirs)
        raise
    print(f"ready: examlops in {ours_start:.1f} s, mlflow models serve in {theirs_start:.1f} s", flush=True)
    return settings, ours, theirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000, help="requests per run at c=8 and c=64")
    parser.add_argument("--home", type=Path, default=Path(".examlops/bench"), help="state folder of the bench")
    args = parser.parse_args()

    ours_port, theirs_port = 18101, 18102
    settings, ours, theirs = start_pair(args.home.resolve(), ours_port, theirs_port)
    auth = admin_headers(settings)
    try:
        os.sched_setaffinity(0, {CLIENT_CORE})

        rng = np.random.default_rng(1)
        embeddings = [rng.normal(0, 0.05, 384).round(6).tolist() for _ in range(64)]
        ours_bodies = [json.dumps({"model": "JPCP", "embedding": e, "node_count": 12}).encode() for e in embeddings]
        theirs_bodies = [json.dumps({"inputs": [[*e, 12.0]]}).encode() for e in embeddings]
        ours_url = f"http://127.0.0.1:{ours_port}/infer-pipeline/infer"
        theirs_url = f"http://127.0.0.1:{theirs_port}/invocations"

        results: list[tuple[int, LoadResult, LoadResult]] = []
        for concurrency in (1, 8, 64):
            total = args.requests // 4 if concurrency == 1 else args.requests
            for url, bodies in ((ours_url, ours_bodies), (theirs_url, theirs_bodies)):
                headers = auth if url == ours_url else None
                asyncio.run(
                    run_load(url, lambda i, b=bodies: b[i % 64], total=100, concurrency=concurrency, headers=headers)
                )
            a = asyncio.run(
                run_load(ours_url, lambda i: ours_bodies[i % 64], total=total, concurrency=concurrency, headers=auth)
            )
            b = asyncio.run(run_load(theirs_url, lambda i: theirs_bodies[i % 64], total=total, concurrency=concurrency))
            results.append((concurrency, a, b))
            failed = {name: r.statuses for name, r in (("examlops", a), ("mlflow", b)) if r.errors}
            print(f"c={concurrency}: done" + (f", replies by status {failed}" if failed else ""), flush=True)
        limit = in_process_limit(settings)
    finally:
        stop(ours)
        stop(theirs)

    print()
    print("server pinned to core 0, load generator to core 1; JPCP v1 (HistGradientBoosting, 385 inputs)")
    header = f"{'c':>3} | {'server':<20} | {'req/s':>8} | {'p50 ms':>8} | {'p99 ms':>8} | {'errors':>6} | {'sent':>6}"
    print(header)
    print("-" * len(header))
    for concurrency, a, b in results:
        for name, r in (("examlops", a), ("mlflow models serve", b)):
            print(
                f"{concurrency:>3} | {name:<20} | {r.rps:>8.1f} | {r.p50:>8.2f} | {r.p99:>8.2f} | "
                f"{r.errors:>6} | {r.sent:>6}"
            )
        ratio = a.rps / b.rps if b.rps else float("inf")
        print(f"{concurrency:>3} | {'ratio examlops/mlflow':<20} | {ratio:>8.2f}x")
    print()
    print(f"in-process limit (predict on batches of 32, one core): {limit:,.0f} rows/s")
    for concurrency, a, _ in results:
        print(f"  c={concurrency}: examlops serves {a.rps / limit:.1%} of it")


if __name__ == "__main__":
    main()
