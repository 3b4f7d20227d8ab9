"""A plain Ray Serve app serving one MLflow sklearn model: the peer a user writes by hand, for `bench/replicas.py`.

One deployment class, ``Model``, with ``num_replicas`` replicas: each loads the same artifact as the Ray
engine (the version's local MLflow model folder, fetched once by this driver) with
``mlflow.sklearn.load_model``, and batches predictions with ``@serve.batch(max_batch_size=32,
batch_wait_timeout_s=0.05)`` (the seed's 32 / 50 ms). Its HTTP route takes the body the bench sends to
examlops, ``{"model": ..., "embedding": [384 floats], "node_count": n}``, predicts on the row
``[*embedding, node_count]`` and answers ``{"prediction": value}`` (a ``JSONResponse``: Ray's proxy sends
a returned dict chunked, with no length); a GET answers 200 (readiness).
``max_ongoing_requests`` is 64, twice the batch size, so that a replica can fill its batches (Ray's
default of 5 would cap every batch at 5 rows). No validation, auth, metrics or limits: the bare peer.

The driver starts a local Ray cluster of ``--num-cpus`` CPUs (no dashboard, its folder under ``--temp-dir``),
Serve's proxy on ``--port``, runs the app at ``/predict`` and serves until SIGTERM/SIGINT, then shuts
Serve and the cluster down.

    .venv/bin/python bench/plain_ray_app.py --model-uri models:/JPCP/1 --port 8100 --replicas 2 \
        --temp-dir /tmp/plain-ray
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

MAX_BATCH_SIZE = 32
BATCH_WAIT_S = 0.05


@serve.deployment(max_ongoing_requests=2 * MAX_BATCH_SIZE)
class Model:
    """One replica: the model in memory, batched predictions, the JSON route."""

    def __init__(self, location: str) -> None:
        import mlflow.sklearn

        self.model: Any = mlflow.sklearn.load_model(location)

    @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=BATCH_WAIT_S)
    async def predict(self, rows: list[list[float]]) -> list[float]:
        values = self.model.predict(np.asarray(rows, dtype=np.float64))
        return [float(v) for v in values]

    async def __call__(self, request: Request) -> JSONResponse:
        if request.method == "GET":
            return JSONResponse({"ready": True})
        body = await request.json()
        prediction = await self.predict([*body["embedding"], float(body["node_count"])])
        return JSONResponse({"prediction": prediction})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-uri", required=True, help="the MLflow model to serve, e.g. models:/JPCP/1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--num-cpus", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--temp-dir", type=Path, required=True, help="the local cluster's folder (short path)")
    args = parser.parse_args()

    import mlflow.artifacts
    import ray

    location = mlflow.artifacts.download_artifacts(artifact_uri=args.model_uri)
    args.temp_dir.mkdir(parents=True, exist_ok=True)
    ray.init(
        num_cpus=args.num_cpus,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=str(args.temp_dir.resolve()),
        _node_ip_address="127.0.0.1",
    )
    stopped = threading.Event()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        serve.run(Model.options(num_replicas=args.replicas).bind(location), name="plain", route_prefix="/predict")
        signal.signal(signal.SIGTERM, lambda *_: stopped.set())  # after Serve's start, which sets its own
        signal.signal(signal.SIGINT, lambda *_: stopped.set())
        print(f"serving {args.model_uri} with {args.replicas} replica(s) at http://127.0.0.1:{args.port}/predict")
        stopped.wait()
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]  # ray leaves it unannotated
        ray.shutdown()


if __name__ == "__main__":
    main()
