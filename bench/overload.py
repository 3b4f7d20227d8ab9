"""Overload with admission control on and off, side by side in one run (issue 17, seed 001).

Two `exa serve start` on one state folder (``.examlops/bench-overload`` by default), on free ports: one
with the defaults (admission on), one with ``EXAMLOPS_ADMISSION__ENABLED=false`` (every call is queued;
calls whose budget runs out while queued are still dropped). Both get ``--workers`` predict workers
(1 by default), tracing off (the same for both, and not what is measured here) and one BLAS thread per
process.

So that the predict pool, where admission acts, is what saturates (not HTTP handling, which a Python
client on the same two cores could not outrun), the state folder's JPCP Production is a heavy model: a
brute-force k-nearest-neighbours regressor over ``--train-rows`` rows (about 8 ms of CPU a row at
100,000 rows: a capacity near 120 calls/s on one worker), registered once and marked with the alias
``Overload``.

1. Capacity: a closed loop of ``--capacity-requests`` calls with the loose budget at c=32 on the
   admission-on server gives a start; then the knee (``knee``): the highest open-loop rate the
   admission-off server keeps up with (every call answered, p99 within a third of the loose budget),
   searched from that start. The knee is the capacity C (``--no-knee``: the closed loop's figure;
   ``--capacity``: C as given, to compare two commits at the same arrivals).
2. For each load of ``--loads`` (0.5, 1, 2, 4 times C): ``--seconds`` of open-loop Poisson arrivals
   (``openloop``) on each server in turn (the order alternates), half with the tight budget
   (``--tight-ms``), half with the loose one (``--loose-ms``), the budget in the body's ``budget_ms``.
   A call is given up by the client at its budget plus 1 s.

Printed per load and server: calls sent; answered within their budget (client-side time, HTTP
included); answered late; refused early and late; given up; the share of admitted calls (all but the
early refusals) answered within budget, by budget kind; goodput (answered within budget per second) as a
share of C (answers within budget that came while arrivals lasted, per second); p99 time of an early
refusal; the cores busy on average over the segment (psutil): serving's own process, its predict workers,
and this bench's client, which share the machine; and the share of the machine's CPU time the hypervisor
stole over it (``procs.StealMeter``: a segment under steal ran on a slower machine). The issue's bounds:
with admission, >= 99 % of admitted calls within budget at every load, goodput at 2x >= 80 % of C, early
refusals p99 < 10 ms.

    .venv/bin/python bench/overload.py [--seconds 6] [--loads 0.5 1 2 4] [--tight-ms 300] [--loose-ms 3000] \
        [--workers 1] [--train-rows 100000] [--capacity-requests 600] [--no-knee | --capacity C] \
        [--home PATH] [--seed 1]

Figures only: nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
from sklearn.neighbors import KNeighborsRegressor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo import auth_headers, bodies, demo_state
from knee import knee
from loadgen import run_load
from openloop import Sent, open_loop
from procs import StealMeter, answers, drain, free_port, quantile, split_cpu, start, stop, wait_until

from examlops.core.settings import Settings
from examlops.registry.catalog import Catalog
from examlops.registry.mlflow_registry import MlflowRegistry
from examlops.registry.registration import ensure_experiment, log_and_register

MODEL = "JPCP"
MARK = "Overload"
PATH = f"/v1/models/{MODEL}/predict"


def heavy_model(train_rows: int, width: int) -> KNeighborsRegressor:
    """The bench's heavy model: a brute-force k-NN over ``train_rows`` rows of ``width`` features (fixed seed)."""
    rng = np.random.default_rng(7)
    x = rng.normal(0, 0.05, (train_rows, width))
    return KNeighborsRegressor(n_neighbors=5, algorithm="brute").fit(x, x[:, :8].sum(axis=1))


def mixed_budgets(
    pool: list[bytes], tight_ms: float, loose_ms: float
) -> Callable[[random.Random], tuple[str, float, bytes]]:
    """``open_loop``'s pick: a body of ``pool``, half of the calls with the tight budget and half with the loose."""

    def pick(rng: random.Random) -> tuple[str, float, bytes]:
        kind, budget = ("tight", tight_ms) if rng.random() < 0.5 else ("loose", loose_ms)
        body = dict(orjson.loads(pool[rng.randrange(len(pool))]))
        body["budget_ms"] = budget
        return kind, budget, orjson.dumps(body)

    return pick


def heavy_version(settings: Settings, catalog: Catalog, train_rows: int) -> str:
    """The version of the heavy model (registered on first use): JPCP Production and ``Overload`` point at it."""
    registry = MlflowRegistry(settings.mlflow_tracking_uri, settings.state_dir / "cache" / "models")
    have = registry.aliases(MODEL)
    if MARK in have:
        return have[MARK].version
    spec = catalog.get(MODEL)
    model = heavy_model(train_rows, spec.embedding_dim + 1)
    experiment = ensure_experiment(registry, settings, "examlops-bench")
    params = {"model": "KNeighborsRegressor(brute)", "train_rows": str(train_rows)}
    version = log_and_register(registry, settings, experiment, spec, model, "overload-knn", {}, params).version
    registry.set_alias(MODEL, "Production", version)
    registry.set_alias(MODEL, MARK, version)
    return version


def segment_options(parser: argparse.ArgumentParser) -> None:
    """The options of the benches that replay overload segments on this bench's state folder (``--rates`` and
    what ``segment_state`` reads)."""
    parser.add_argument("--rates", type=float, nargs="+", required=True, help="Calls per second, one segment each.")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--tight-ms", type=float, default=300.0)
    parser.add_argument("--loose-ms", type=float, default=3000.0)
    parser.add_argument("--train-rows", type=int, default=100_000)
    parser.add_argument("--home", type=Path, default=Path(".examlops/bench-overload"))
    parser.add_argument("--seed", type=int, default=1)


def segment_state(args: argparse.Namespace) -> tuple[Settings, Path, dict[str, str], list[bytes]]:
    """For ``segment_options``' values: the settings and folder of ``--home`` with its heavy model registered,
    the admin's headers, and the pool of 64 bodies."""
    home = args.home.resolve()
    settings, catalog = demo_state(home)
    heavy_version(settings, catalog, args.train_rows)
    pool = [orjson.dumps(b) for b in bodies(catalog.get(MODEL).embedding_dim, 64, seed=args.seed)]
    return settings, home, auth_headers(settings), pool


def warm(url: str, pool: list[bytes], loose_ms: float, headers: dict[str, str]) -> None:
    """Warm a server as the segment benches do: 200 calls with the loose budget at c=8, then 600 at c=32
    (connections, the estimator's cost table, the model's first calls)."""
    loose = [orjson.dumps({**orjson.loads(b), "budget_ms": loose_ms}) for b in pool]
    for total, concurrency in ((200, 8), (600, 32)):
        asyncio.run(run_load(url + PATH, lambda i: loose[i % len(loose)], total=total, concurrency=concurrency,
                             headers=headers))  # fmt: skip


@dataclass
class Server:
    name: str
    url: str
    process: subprocess.Popen[bytes]


def start_server(home: Path, admission: bool, workers: int, extra: dict[str, str] | None = None) -> Server:
    """One ``exa serve start`` of the bench (module docstring); ``extra``: more settings (``EXAMLOPS_...``)."""
    port = free_port()
    name = "on" if admission else "off"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXAMLOPS_")}
    env |= {
        "EXAMLOPS_HOME": str(home),
        "EXAMLOPS_SERVING__PORT": str(port),
        "EXAMLOPS_PREDICT__WORKERS": str(workers),
        "EXAMLOPS_ADMISSION__ENABLED": "true" if admission else "false",
        "EXAMLOPS_TRACING__ENABLED": "false",
        "EXAMLOPS_HOTSET__RELOAD_POLL_S": "0",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    env |= extra or {}
    process = start([sys.executable, "-m", "examlops.cli.main", "serve", "start"], env, home / f"serving-{name}.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            answers(f"{url}/readyz"), f"the admission-{name} server (see {home}/serving-{name}.log)", proc=process
        )  # type: ignore[arg-type]
    except BaseException:
        stop(process)
        raise
    return Server(name, url, process)


@dataclass
class Tally:
    load: float
    server: str
    seconds: float
    records: list[Sent]
    cores: dict[str, float]
    """Cores busy on average over the segment (its arrivals and the wait for their answers): ``own``
    serving's process (HTTP, admission, batching), ``children`` its predict workers, ``here`` this bench's
    client."""
    steal: float
    """The machine's CPU time stolen by the hypervisor over the segment (``procs.StealMeter``)."""

    def summary(self, capacity: float) -> dict[str, object]:
        sent = [r for r in self.records if r.sent]
        within = [r for r in sent if r.status == 200 and r.latency_ms <= r.budget_ms]
        early = [r for r in sent if r.status == 503 and r.refused == "budget"]
        admitted = [r for r in sent if not (r.status == 503 and r.refused == "budget")]
        by_kind = {}
        for kind in ("tight", "loose"):
            mine = [r for r in admitted if r.kind == kind]
            ok = sum(1 for r in mine if r.status == 200 and r.latency_ms <= r.budget_ms)
            by_kind[kind] = ok / len(mine) if mine else float("nan")
        return {
            "load": self.load,
            "admission": self.server,
            "offered": len(self.records),
            "not_sent": len(self.records) - len(sent),
            "within": len(within),
            "late_answer": sum(1 for r in sent if r.status == 200 and r.latency_ms > r.budget_ms),
            "refused_early": len(early),
            "refused_late": sum(1 for r in sent if r.status == 503 and r.refused == "late"),
            "given_up": sum(1 for r in sent if r.status == 0),
            "other": sum(1 for r in sent if r.status not in (0, 200, 503)),
            "admitted_within": len(within) / len(admitted) if admitted else float("nan"),
            "tight_within": by_kind["tight"],
            "loose_within": by_kind["loose"],
            # Goodput: answers within budget that came while the arrivals lasted (not the drain after), per second.
            "goodput_of_capacity": sum(1 for r in within if r.sent_at + r.latency_ms / 1000 <= self.seconds)
            / self.seconds
            / capacity
            if capacity
            else float("nan"),
            "early_p99_ms": quantile([r.latency_ms for r in early], 0.99),
            "cores_serving": self.cores["own"],
            "cores_workers": self.cores["children"],
            "cores_client": self.cores["here"],
            "steal": self.steal,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="Seconds of arrivals per load and server.")
    parser.add_argument("--loads", type=float, nargs="+", default=[0.5, 1, 2, 4], help="Multiples of capacity.")
    parser.add_argument("--tight-ms", type=float, default=300.0)
    parser.add_argument("--loose-ms", type=float, default=3000.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--train-rows", type=int, default=100_000)
    parser.add_argument("--capacity-requests", type=int, default=600)
    parser.add_argument(
        "--knee", action=argparse.BooleanOptionalAction, default=True, help="Capacity from the open-loop knee."
    )
    parser.add_argument(
        "--home",
        type=Path,
        default=Path(".examlops/bench-overload"),
        help="State folder; the heavy model is registered once per folder, so a new --train-rows needs a new one.",
    )
    parser.add_argument(
        "--capacity",
        type=float,
        help="C in calls/s, taken as given (no closed loop, no knee): two commits compared at the same arrivals.",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="Print the summaries as JSON lines too.")
    args = parser.parse_args()
    if args.capacity is not None and args.capacity <= 0:
        parser.error("--capacity must be a positive rate in calls/s")

    home = args.home.resolve()
    settings, catalog = demo_state(home)
    version = heavy_version(settings, catalog, args.train_rows)
    headers = auth_headers(settings)
    dim = catalog.get(MODEL).embedding_dim
    pool = [orjson.dumps(b) for b in bodies(dim, 64, seed=args.seed)]
    print(f"JPCP Production = version {version} (k-NN over {args.train_rows} rows); workers {args.workers}")

    servers = [start_server(home, True, args.workers), start_server(home, False, args.workers)]
    try:
        loose = [orjson.dumps({**orjson.loads(b), "budget_ms": args.loose_ms}) for b in pool]
        for server in servers:  # warm: connections, the estimator's cost table, the model's first calls
            asyncio.run(run_load(server.url + PATH, lambda i: loose[i % len(loose)], total=200, concurrency=8,
                                 headers=headers))  # fmt: skip
        cap = (
            None
            if args.capacity is not None
            else asyncio.run(
                run_load(
                    servers[0].url + PATH,
                    lambda i: loose[i % len(loose)],
                    total=args.capacity_requests,
                    concurrency=32,
                    headers=headers,
                )
            )
        )
        if cap is None:
            capacity = args.capacity
            print(f"capacity: {capacity:.0f} calls/s (given)")
        else:
            capacity = cap.rps
            print(f"closed loop: {capacity:.0f} calls/s at c=32 (p50 {cap.p50:.1f} ms, p99 {cap.p99:.1f} ms)")
        if cap is not None and args.knee:
            found, _ = knee(servers[1].url + PATH, capacity, loose[0], headers=headers, p99_ms=args.loose_ms / 3)
            if found:
                capacity = found
            print(f"capacity: {capacity:.0f} calls/s (the knee of open-loop arrivals on admission-off)")

        pick = mixed_budgets(pool, args.tight_ms, args.loose_ms)
        tallies: list[Tally] = []
        for index, load in enumerate(args.loads):
            order = servers if index % 2 == 0 else servers[::-1]
            for server in order:
                began, before, steal = time.monotonic(), split_cpu(server.process.pid), StealMeter()
                records = asyncio.run(
                    open_loop(
                        server.url + PATH, load * capacity, args.seconds, pick, headers=headers, seed=args.seed + index
                    )
                )
                after, took = split_cpu(server.process.pid), time.monotonic() - began
                cores = {name: (after[name] - before[name]) / took for name in before}
                tallies.append(Tally(load, server.name, args.seconds, records, cores, steal.share()))
                print(f"  load {load:g}x on admission-{server.name}: {len(records)} calls, "
                      f"{time.monotonic() - began:.1f} s", flush=True)  # fmt: skip
                drain(server.url)  # its queue empties before the next segment, on either server
        report([t.summary(capacity) for t in tallies], args.json)
    finally:
        for server in servers:
            stop(server.process)


def report(rows: list[dict[str, object]], as_json: bool) -> None:
    print()
    print(
        f"{'load':>5} {'adm':>4} {'offered':>7} {'within':>7} {'late':>5} {'ref.early':>9} {'ref.late':>8} "
        f"{'gave up':>7} {'adm.within':>10} {'tight':>6} {'loose':>6} {'goodput/C':>9} {'early p99':>9} "
        f"{'cores: serving':>14} {'workers':>7} {'client':>6} {'steal':>5}"
    )
    for r in rows:
        print(
            f"{r['load']:>5g} {r['admission']:>4} {r['offered']:>7} {r['within']:>7} {r['late_answer']:>5} "
            f"{r['refused_early']:>9} {r['refused_late']:>8} {r['given_up']:>7} "
            f"{r['admitted_within']:>10.1%} {r['tight_within']:>6.1%} {r['loose_within']:>6.1%} "
            f"{r['goodput_of_capacity']:>9.1%} {r['early_p99_ms']:>8.1f}ms "
            f"{r['cores_serving']:>14.2f} {r['cores_workers']:>7.2f} {r['cores_client']:>6.2f} {r['steal']:>5.0%}"
        )
    if as_json:
        for r in rows:
            print(orjson.dumps(r).decode())


if __name__ == "__main__":
    main()
