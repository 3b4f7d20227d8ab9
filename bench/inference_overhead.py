"""The inference port's overhead per call against each backend's client called directly (issue 19).

Seeds the demo models into a state folder (``.examlops/bench-inference-overhead`` by default,
``demo.demo_state``) and starts, on free ports, `exa serve start` (authentication on, the admin token sent
by both sides) and `mlflow models serve --env-manager local` of ``models:/JPCP@Production``. Then, for
each backend, the same rows two ways:

- local: the port's local adapter (``LocalTarget`` of the MLflow loader) against the loaded model's
  ``predict_batch`` run on a thread pool of the same size (``run_in_executor``);
- examlops: the examlops adapter (model route, alias Production) against an ``httpx.AsyncClient`` POST to
  ``/v1/models/JPCP/predict`` (one row) or ``/v1/models/JPCP/stream`` (32 rows, its NDJSON read whole);
- kserve_v2: the kserve_v2 adapter (examlops' two V2 tensors) against an httpx POST to ``/v2/models/JPCP/infer``;
- mlflow: the mlflow adapter (tensor format) against an httpx POST to ``/invocations``.

Two modes each: ``predict`` of one row and ``predict_many`` of ``--batch`` (32) rows. Calls are sequential
(one at a time), so a call's time is its latency. Every (backend, mode) runs ``2 * --rounds`` pairs of
segments, one direct and one port segment of ``--calls`` calls each (a quarter of that for batches), half
of the pairs direct first, the others port first; the pairs of every backend and mode run in one sequence a
seeded shuffle orders: this machine's speed drifts over seconds, so only segments close in time compare.
Before the first pair each side makes ``--warm-up`` untimed calls, and the two sides' answers are checked
equal (printed MISMATCH otherwise).

Printed per backend and mode: the median over the pairs of direct µs/call and of port µs/call, the median
of the pairs' differences (overhead µs) and that as a percentage of the direct median, with the
differences' range.
``--policy`` wraps every adapter in the default resilience policy (``ResilientAdapter``) as well.

    PYTHONPATH=. .venv/bin/python bench/inference_overhead.py [--rounds 7] [--calls 60] [--batch 32] [--warm-up 20] \
        [--seed 1] [--policy] [--home DIR]

Figures only: nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo import auth_headers, demo_state
from demo import bodies as demo_bodies
from procs import answers, free_port, start, stop, wait_until

from examlops.inference import Inference, InferenceSpec, Wiring
from examlops.inference.adapters.examlops import ExamlopsTarget
from examlops.inference.adapters.kserve_v2 import EXAMLOPS_V2, V2Target
from examlops.inference.adapters.local import DEFAULT_WORKERS, LocalTarget
from examlops.inference.adapters.mlflow import MlflowTarget
from examlops.inference.loaders import mlflow_model

BIN = Path(sys.executable).parent
MODEL_URI = "models:/JPCP@Production"


class Pavement(BaseModel):
    embedding: list[float]
    node_count: int


class Score(BaseModel):
    prediction: float


SCORE = InferenceSpec(name="score", input=Pavement, output=Score)
Rows = list[dict[str, Any]]
Caller = Callable[[Rows], Awaitable[list[float]]]


@dataclass
class Pair:
    """One backend's direct and port callers, and the segments' µs per call, by mode."""

    backend: str
    direct: Caller
    port: Caller
    timings: dict[tuple[str, str], list[float]] = field(default_factory=dict)


def headers_json(headers: dict[str, str]) -> dict[str, str]:
    return {**headers, "Content-Type": "application/json"}


async def segment(caller: Caller, rows: Rows, calls: int) -> float:
    """µs per call over ``calls`` sequential calls."""
    started = time.perf_counter()
    for _ in range(calls):
        await caller(rows)
    return (time.perf_counter() - started) / calls * 1e6


def direct_callers(serving_url: str, mlflow_url: str, headers: dict[str, str], model: Any) -> dict[str, Caller]:
    """What calling each backend's client directly is; the clients are module-level for the run."""
    client = httpx.AsyncClient(headers=headers_json(headers), timeout=60)
    scoring = httpx.AsyncClient(timeout=60)
    pool = concurrent.futures.ThreadPoolExecutor(DEFAULT_WORKERS)

    async def local(rows: Rows) -> list[float]:
        out = await asyncio.get_running_loop().run_in_executor(pool, model.predict_batch, rows)
        return [o["prediction"] for o in out]

    async def examlops(rows: Rows) -> list[float]:
        if len(rows) == 1:
            reply = await client.post(f"{serving_url}/v1/models/JPCP/predict", json={**rows[0], "alias": "Production"})
            return [reply.json()["prediction"]]
        reply = await client.post(
            f"{serving_url}/v1/models/JPCP/stream", json={"instances": rows, "alias": "Production"}
        )
        lines = [json.loads(line) for line in reply.text.splitlines() if line.strip()]
        return [p for line in lines if not line.get("done") for p in line["predictions"]]

    async def kserve_v2(rows: Rows) -> list[float]:
        body = {
            "inputs": [
                {"name": "embedding", "shape": [len(rows), len(rows[0]["embedding"])], "datatype": "FP64",
                 "data": [r["embedding"] for r in rows]},
                {"name": "node_count", "shape": [len(rows)], "datatype": "INT64",
                 "data": [r["node_count"] for r in rows]},
            ],
            "parameters": {"alias": "Production"},
        }  # fmt: skip
        reply = await client.post(f"{serving_url}/v2/models/JPCP/infer", json=body)
        return list(reply.json()["outputs"][0]["data"])

    async def mlflow(rows: Rows) -> list[float]:
        body = {"inputs": [[*r["embedding"], float(r["node_count"])] for r in rows]}
        reply = await scoring.post(f"{mlflow_url}/invocations", json=body)
        return [float(p) for p in reply.json()["predictions"]]

    return {"local": local, "examlops": examlops, "kserve_v2": kserve_v2, "mlflow": mlflow}


def port_wiring(serving_url: str, mlflow_url: str, token: str, tracking_uri: str, policy: bool) -> Wiring:
    """One spec per backend (``score-<backend>``), as a wiring binds them."""
    return Wiring(
        {
            "score-local": LocalTarget(mlflow_model(MODEL_URI, tracking_uri=tracking_uri)),
            "score-examlops": ExamlopsTarget(model="JPCP", alias="Production"),
            "score-kserve_v2": V2Target(model="JPCP", inputs=EXAMLOPS_V2, parameters={"alias": "Production"}),
            "score-mlflow": MlflowTarget(url=mlflow_url, format="tensor"),
        },
        adapters={"examlops": {"url": serving_url, "token": token}, "kserve_v2": {"url": serving_url, "token": token}},
        policy={} if policy else None,
    )


def port_caller(inference: Inference, backend: str) -> Caller:
    port = inference.model(InferenceSpec(name=f"score-{backend}", input=Pavement, output=Score))

    async def call(rows: Rows) -> list[float]:
        if len(rows) == 1:
            return [(await port.predict(rows[0])).prediction]
        return [s.prediction for s in await port.predict_many(rows)]

    return call


def close_enough(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-9 * max(1.0, abs(x)) for x, y in zip(a, b, strict=True))


async def measure(pairs: list[Pair], modes: dict[str, Rows], args: argparse.Namespace) -> None:
    for pair in pairs:
        for mode, rows in modes.items():
            direct = await pair.direct(rows)
            ported = await pair.port(rows)
            print(f"{pair.backend:9} {mode:12} answers {'equal' if close_enough(direct, ported) else 'MISMATCH'}")
            for _ in range(args.warm_up):
                await pair.direct(rows)
                await pair.port(rows)
    plan = [(pair, mode, order) for pair in pairs for mode in modes for order in (0, 1)] * args.rounds
    random.Random(args.seed).shuffle(plan)
    for pair, mode, order in plan:
        sides = [("direct", pair.direct), ("port", pair.port)]
        for side, caller in sides if order == 0 else sides[::-1]:
            calls = args.calls if mode == "predict" else max(1, args.calls // 4)
            pair.timings.setdefault((mode, side), []).append(await segment(caller, modes[mode], calls))


def report(pairs: list[Pair], modes: dict[str, Rows]) -> None:
    print(f"\n{'backend':9} {'mode':16} {'direct µs':>10} {'port µs':>10} {'overhead µs':>12} {'%':>7}  range µs")
    for pair in pairs:
        for mode in modes:
            direct, port = pair.timings[(mode, "direct")], pair.timings[(mode, "port")]
            # The i-th direct and port segments are one pair, made back to back.
            diffs = [p - d for d, p in zip(direct, port, strict=True)]
            d, p, o = statistics.median(direct), statistics.median(port), statistics.median(diffs)
            label = "predict" if mode == "predict" else f"predict_many({len(modes[mode])})"
            print(
                f"{pair.backend:9} {label:16} {d:10.0f} {p:10.0f} {o:12.0f} {100 * o / d:6.1f}%"
                f"  {min(diffs):.0f}..{max(diffs):.0f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=60, help="calls per predict segment (a quarter for batches)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--warm-up", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policy", action="store_true", help="the default resilience policy around every adapter")
    parser.add_argument("--home", type=Path, default=Path(".examlops/bench-inference-overhead"))
    args = parser.parse_args()

    home = args.home.resolve()
    settings, catalog = demo_state(home)
    headers = auth_headers(settings)
    token = headers["Authorization"].removeprefix("Bearer ")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXAMLOPS_")}
    serving_port, mlflow_port = free_port(), free_port()
    env |= {"EXAMLOPS_HOME": str(home), "EXAMLOPS_SERVING__PORT": str(serving_port)}
    serving = start([sys.executable, "-m", "examlops.cli.main", "serve", "start"], env, home / "serving.log")
    scoring_env = {**env, "MLFLOW_TRACKING_URI": settings.mlflow_tracking_uri, "PATH": f"{BIN}:{env['PATH']}"}
    scoring = start(
        [str(BIN / "mlflow"), "models", "serve", "-m", MODEL_URI, "-h", "127.0.0.1", "-p", str(mlflow_port),
         "--env-manager", "local"],
        scoring_env,
        home / "mlflow-serve.log",
    )  # fmt: skip
    serving_url, mlflow_url = f"http://127.0.0.1:{serving_port}", f"http://127.0.0.1:{mlflow_port}"
    try:
        wait_until(answers(f"{serving_url}/readyz"), f"serving (see {home}/serving.log)", proc=serving)
        wait_until(answers(f"{mlflow_url}/ping"), f"mlflow models serve (see {home}/mlflow-serve.log)", proc=scoring)
        dim = catalog.get("JPCP").embedding_dim
        rows: Rows = [dict(b) for b in demo_bodies(dim, args.batch, seed=args.seed)]
        modes = {"predict": rows[:1], "predict_many": rows}
        model = mlflow_model(MODEL_URI, tracking_uri=settings.mlflow_tracking_uri)()

        async def run() -> list[Pair]:
            direct = direct_callers(serving_url, mlflow_url, headers, model)
            wiring = port_wiring(serving_url, mlflow_url, token, settings.mlflow_tracking_uri, args.policy)
            async with Inference.from_wiring(wiring) as inference:
                pairs = [Pair(name, direct[name], port_caller(inference, name)) for name in direct]
                await measure(pairs, modes, args)
            return pairs

        pairs = asyncio.run(run())
        report(pairs, modes)
    finally:
        stop(scoring)
        stop(serving)


if __name__ == "__main__":
    main()
