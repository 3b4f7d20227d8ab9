"""Rows per second for a batch of 32 rows: V2 binary, V2 JSON and the model route, beside `mlflow models serve`.

One run, the same 32 rows (JPCP v1 pinned everywhere, tensor signature on MLflow's side), servers on core 0
and the load generator on core 1 (as ``serving_vs_mlflow.py``):

- V2 binary: `POST /v2/models/JPCP/versions/1/infer`, FP32 embedding and INT64 node counts after the JSON,
  the prediction back in binary (tritonclient's default mode);
- V2 JSON: the same request all in JSON;
- model route: the 32 rows as 32 concurrent `POST /v1/models/JPCP/predict` (one row each), so the
  micro-batcher can put them in one predict as it does for V2's rows;
- `mlflow models serve`: `POST /invocations` with the 32 rows as one tensor (`{"inputs": [[...385]] * 32}`).

Each client keeps ``concurrency`` batches of 32 in flight (the model route 32 x ``concurrency`` rows).

    .venv/bin/python bench/v2_rows.py [--batches 300] [--concurrency 1 4] [--home .examlops/bench-v2]

Figures only: nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's examlops, not the venv's install
sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import LoadResult, run_load
from procs import stop
from serving_vs_mlflow import CLIENT_CORE, admin_headers, start_pair

ROWS = 32


def v2_bodies(embedding: np.ndarray, counts: np.ndarray) -> tuple[bytes, bytes, dict[str, str]]:
    """(JSON body, binary body, binary headers) of one V2 request holding every row."""
    as_json = {
        "inputs": [
            {"name": "embedding", "datatype": "FP32", "shape": [ROWS, 384], "data": embedding.tolist()},
            {"name": "node_count", "datatype": "INT64", "shape": [ROWS], "data": counts.tolist()},
        ]
    }
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "embedding",
                    "datatype": "FP32",
                    "shape": [ROWS, 384],
                    "parameters": {"binary_data_size": embedding.nbytes},
                },
                {
                    "name": "node_count",
                    "datatype": "INT64",
                    "shape": [ROWS],
                    "parameters": {"binary_data_size": counts.nbytes},
                },
            ],
            "outputs": [{"name": "prediction", "parameters": {"binary_data": True}}],
        }
    ).encode()
    binary = head + embedding.tobytes() + counts.tobytes()
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))}
    return json.dumps(as_json).encode(), binary, headers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=300, help="batches of 32 rows per client and concurrency")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4], help="batches in flight")
    parser.add_argument("--home", type=Path, default=Path(".examlops/bench-v2"), help="state folder of the bench")
    args = parser.parse_args()

    ours_port, theirs_port = 18111, 18112
    settings, ours, theirs = start_pair(args.home.resolve(), ours_port, theirs_port)
    try:
        os.sched_setaffinity(0, {CLIENT_CORE})
        rng = np.random.default_rng(1)
        embedding = rng.normal(0, 0.05, (ROWS, 384)).astype(np.float32)
        counts = rng.integers(1, 200, ROWS).astype(np.int64)
        as_json, as_binary, binary_headers = v2_bodies(embedding, counts)
        auth = admin_headers(settings)
        binary_headers["Authorization"] = auth["Authorization"]
        rows = embedding.astype(np.float64).tolist()
        predict_bodies = [
            json.dumps({"embedding": row, "node_count": int(count), "version": 1}).encode()
            for row, count in zip(rows, counts, strict=True)
        ]
        mlflow_body = json.dumps({"inputs": [[*row, float(count)] for row, count in zip(rows, counts, strict=True)]})
        v2_url = f"http://127.0.0.1:{ours_port}/v2/models/JPCP/versions/1/infer"
        clients = [
            ("V2 binary", v2_url, lambda i: as_binary, binary_headers, 1),
            ("V2 JSON", v2_url, lambda i: as_json, auth, 1),
            (
                "model route",
                f"http://127.0.0.1:{ours_port}/v1/models/JPCP/predict",
                lambda i: predict_bodies[i % ROWS],
                auth,
                ROWS,
            ),
            (
                "mlflow models serve",
                f"http://127.0.0.1:{theirs_port}/invocations",
                lambda i: mlflow_body.encode(),
                None,
                1,
            ),
        ]
        results: list[tuple[int, str, LoadResult, int]] = []
        for concurrency in args.concurrency:
            for name, url, body_for, headers, fan in clients:
                warm = max(10, args.batches // 10) * fan
                asyncio.run(run_load(url, body_for, total=warm, concurrency=concurrency * fan, headers=headers))
                total = args.batches * fan
                result = asyncio.run(
                    run_load(url, body_for, total=total, concurrency=concurrency * fan, headers=headers)
                )
                results.append((concurrency, name, result, fan))
            print(f"c={concurrency}: done", flush=True)
    finally:
        stop(ours)
        stop(theirs)

    print()
    print(f"batches of {ROWS} rows, JPCP v1; server on core 0, load generator on core 1")
    header = f"{'c':>3} | {'client':<20} | {'rows/s':>9} | {'p50 ms':>8} | {'p99 ms':>8} | {'errors':>6} | {'sent':>6}"
    print(header)
    print("-" * len(header))
    for concurrency, name, r, fan in results:
        rows_per_s = r.rps * (1 if fan == ROWS else ROWS)
        print(
            f"{concurrency:>3} | {name:<20} | {rows_per_s:>9.0f} | {r.p50:>8.2f} | {r.p99:>8.2f} | "
            f"{r.errors:>6} | {r.sent:>6}"
        )
    print("(model route latencies are per row; the others per batch of 32)")
    for concurrency, name, r, _ in results:
        if r.errors:
            print(f"c={concurrency} {name}: replies by status {dict(sorted(r.statuses.items()))}")


if __name__ == "__main__":
    main()
