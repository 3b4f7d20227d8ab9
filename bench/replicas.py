"""Throughput at c=64 with 1 and 2 serving replicas on this machine: the uvicorn engine, the Ray engine,
`mlflow models serve` and a plain Ray Serve app with `@serve.batch`, in one run.

A replica is, for each server:

- the uvicorn engine: one `exa serve start` process with one predict worker; 2 replicas are two processes,
  the load split over both (c=32 each), as two instances behind a balancer would share it;
- the Ray engine: `exa serve start --engine ray` with `EXAMLOPS_RAY__NUM_REPLICAS` = 1 or 2 model replicas
  (one ingress either way) on a local Ray cluster of 2 CPUs;
- `mlflow models serve -w 1` or `-w 2` (uvicorn workers), the tensor signature of the same version;
- the plain Ray Serve app (`bench/plain_ray_app.py`: one deployment, `@serve.batch` 32 / 50 ms, the same
  artifact and request body) with `num_replicas` 1 or 2 on a local Ray cluster of 2 CPUs.

One model (JPCP v1), one request = one row of 384 floats + node count. Each configuration is started alone,
warmed with 200 requests, then sent ``--requests`` at c=64 by the minimal asyncio load generator, which
shares the machine's two cores with the servers (nothing is pinned: replicas need both cores). After the load,
the PSS of each server's process tree; memory per replica is the tree's growth from 1 to 2 replicas.

    .venv/bin/python bench/replicas.py [--requests 3000] [--skip ray] [--skip plain-ray] [--home /tmp/bench-replicas]
    .venv/bin/python bench/replicas.py --only ray      # the Ray engine's points alone

Figures only: nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo import admin_token, demo_state
from lean_replicas import environment, tree_memory
from loadgen import LoadResult, run_load
from procs import answers, free_port, start, stop, wait_until

BIN = Path(sys.executable).parent
CONCURRENCY = 64
SERVERS = ("uvicorn", "ray", "mlflow", "plain-ray")


@dataclass(frozen=True)
class Measured:
    server: str
    replicas: int
    ready_s: float
    result: LoadResult
    pss_mb: float


@dataclass(frozen=True)
class Target:
    procs: list[subprocess.Popen[bytes]]
    urls: list[str]
    bodies: list[bytes]
    headers: dict[str, str] | None


def bodies_for(kind: str) -> list[bytes]:
    rng = np.random.default_rng(1)
    embeddings = [rng.normal(0, 0.05, 384).round(6).tolist() for _ in range(64)]
    if kind == "mlflow":
        return [json.dumps({"inputs": [[*e, 12.0]]}).encode() for e in embeddings]
    return [json.dumps({"model": "JPCP", "embedding": e, "node_count": 12}).encode() for e in embeddings]


def start_examlops(home: Path, env: dict[str, str], replicas: int, engine: str, token: str) -> Target:
    procs, urls = [], []
    instances = replicas if engine == "uvicorn" else 1
    for i in range(instances):
        port = free_port()
        argv = [str(BIN / "exa"), "serve", "start", "--port", str(port), "--engine", engine]
        # One predict worker per uvicorn instance; on Ray the model replicas size the ingress's in-flight
        # batches (the runtime's capacity), so predict.workers is left alone there.
        extra = {"EXAMLOPS_PREDICT__WORKERS": "1"} if engine == "uvicorn" else {}
        extra |= {"EXAMLOPS_RAY__NUM_REPLICAS": str(replicas), "EXAMLOPS_RAY__NUM_CPUS": "2"}
        extra |= {"EXAMLOPS_HOME": str(home / f"{engine}-{replicas}-{i}")}
        Path(extra["EXAMLOPS_HOME"]).mkdir(parents=True, exist_ok=True)
        shared = {"EXAMLOPS_DATABASE_URL": f"sqlite:///{home / 'examlops.db'}", "EXAMLOPS_TOKEN": token}
        procs.append(start(argv, {**env, **extra, **shared}, home / f"{engine}-{replicas}-{i}.log"))
        urls.append(f"http://127.0.0.1:{port}")
    for proc, url in zip(procs, urls, strict=True):
        wait_until(answers(f"{url}/readyz"), f"exa serve start --engine {engine}", proc=proc, timeout=300)
    paths = [f"{url}/infer-pipeline/infer" for url in urls]
    return Target(procs, paths, bodies_for("examlops"), {"Authorization": f"Bearer {token}"})


def start_mlflow(home: Path, env: dict[str, str], replicas: int) -> Target:
    port = free_port()
    argv = [str(BIN / "mlflow"), "models", "serve", "-m", "models:/JPCP/1", "-h", "127.0.0.1", "-p", str(port)]
    argv += ["-w", str(replicas), "--env-manager", "local"]
    proc = start(argv, env, home / f"mlflow-{replicas}.log")
    url = f"http://127.0.0.1:{port}"
    wait_until(answers(f"{url}/ping"), "mlflow models serve", proc=proc, timeout=300)
    return Target([proc], [f"{url}/invocations"], bodies_for("mlflow"), None)


def start_plain_ray(home: Path, env: dict[str, str], replicas: int) -> Target:
    port = free_port()
    argv = [sys.executable, str(Path(__file__).resolve().parent / "plain_ray_app.py"), "--model-uri", "models:/JPCP/1"]
    argv += ["--port", str(port), "--replicas", str(replicas), "--num-cpus", "2"]
    argv += ["--temp-dir", str(home / f"plain-ray-{replicas}")]  # short: Ray's socket paths must fit
    # Token auth on, as the Ray engine keeps it, with a token of this run's (not one saved in ~/.ray).
    ray_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_USAGE_STATS_ENABLED": "0"}
    proc = start(argv, {**env, **ray_env}, home / f"plain-ray-{replicas}.log")
    url = f"http://127.0.0.1:{port}/predict"
    wait_until(answers(url), "the plain Ray Serve app", proc=proc, timeout=300)
    return Target([proc], [url], bodies_for("examlops"), None)


async def load(target: Target, total: int, concurrency: int = CONCURRENCY) -> LoadResult:
    """``total`` requests at ``concurrency``, split evenly over the target's URLs; one result for them all."""
    share = max(1, concurrency // len(target.urls))

    def body(i: int) -> bytes:
        return target.bodies[i % 64]

    results = await asyncio.gather(
        *(
            run_load(url, body, total=total // len(target.urls), concurrency=share, headers=target.headers)
            for url in target.urls
        )
    )
    statuses: dict[int, int] = {}
    for one in results:
        for status, count in one.statuses.items():
            statuses[status] = statuses.get(status, 0) + count
    latencies = [ms for one in results for ms in one.latencies_ms]
    seconds = max(one.seconds for one in results)
    return LoadResult(len(latencies), sum(one.errors for one in results), seconds, latencies, statuses)


def measure(name: str, replicas: int, starter: Callable[[], Target], total: int, concurrency: int) -> Measured:
    began = time.monotonic()
    target = starter()
    ready_s = time.monotonic() - began
    try:
        asyncio.run(load(target, 200))
        result = asyncio.run(load(target, total, concurrency))
        pss = sum(tree_memory(proc.pid).pss_mb for proc in target.procs)
    finally:
        for proc in target.procs:
            stop(proc)
    print(f"{name} x{replicas}: ready {ready_s:.1f} s, {result.rps:.0f} req/s, {result.errors} errors", flush=True)
    return Measured(name, replicas, ready_s, result, pss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000, help="requests per measured run at c=64")
    parser.add_argument("--skip", action="append", default=[], choices=SERVERS)
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help="requests in flight (c)")
    parser.add_argument("--replicas", type=int, action="append", choices=(1, 2), help="only these replica counts")
    parser.add_argument("--only", choices=SERVERS, help="measure this server alone (the others skipped)")
    parser.add_argument("--home", type=Path, default=Path("/tmp/bench-replicas"), help="state folder of the bench")
    args = parser.parse_args()
    if args.only:
        args.skip = [server for server in SERVERS if server != args.only]

    home = args.home.resolve()
    if home.exists():
        shutil.rmtree(home)
    print(f"seeding demo models in {home} ...", flush=True)
    settings, _ = demo_state(home)
    env = environment(home, settings.mlflow_tracking_uri, "jpcp")
    token = admin_token(settings)
    # Every instance shares the seeded state folder's SQL (its identities) and MLflow store.
    env["EXAMLOPS_MLFLOW__TRACKING_URI"] = settings.mlflow_tracking_uri
    env["EXAMLOPS_DATABASE_URL"] = settings.sql_url
    runs: list[Measured] = []
    load_before = os.getloadavg()
    for replicas in args.replicas or (1, 2):
        if "uvicorn" not in args.skip:
            starter = lambda r=replicas: start_examlops(home, env, r, "uvicorn", token)  # noqa: E731
            runs.append(measure("exa uvicorn", replicas, starter, args.requests, args.concurrency))
        if "ray" not in args.skip:
            starter = lambda r=replicas: start_examlops(home, env, r, "ray", token)  # noqa: E731
            runs.append(measure("exa ray", replicas, starter, args.requests, args.concurrency))
        if "mlflow" not in args.skip:
            starter = lambda r=replicas: start_mlflow(home, env, r)  # noqa: E731
            runs.append(measure("mlflow models serve", replicas, starter, args.requests, args.concurrency))
        if "plain-ray" not in args.skip:
            starter = lambda r=replicas: start_plain_ray(home, env, r)  # noqa: E731
            runs.append(measure("plain Ray Serve", replicas, starter, args.requests, args.concurrency))

    load_after = os.getloadavg()
    print()
    before, after = (" / ".join(f"{x:.2f}" for x in one) for one in (load_before, load_after))
    print(f"load average (1/5/15 min): {before} before the runs, {after} after")
    print(f"c={args.concurrency}, {args.requests} requests, JPCP v1, one row a request; servers and load share 2 cores")
    header = f"{'server':<20} | {'replicas':>8} | {'ready s':>7} | {'req/s':>7} | {'p50 ms':>7} | {'p99 ms':>7} | "
    header += f"{'errors':>6} | {'PSS MB':>7}"
    print(header)
    print("-" * len(header))
    for run in runs:
        r = run.result
        print(
            f"{run.server:<20} | {run.replicas:>8} | {run.ready_s:>7.1f} | {r.rps:>7.0f} | {r.p50:>7.1f} | "
            f"{r.p99:>7.1f} | {r.errors:>6} | {run.pss_mb:>7.0f}"
        )
    print()
    for server in dict.fromkeys(run.server for run in runs):
        one = next((run for run in runs if run.server == server and run.replicas == 1), None)
        two = next((run for run in runs if run.server == server and run.replicas == 2), None)
        if one is None or two is None:
            continue
        ratio = two.result.rps / one.result.rps if one.result.rps else float("nan")
        print(f"{server:<20}: 2/1 replicas {ratio:.2f}x req/s; memory per replica {two.pss_mb - one.pss_mb:.0f} MB PSS")


if __name__ == "__main__":
    main()
