"""The drift report of one model over 10,000 and 100,000 snapshots: wall time and peak memory.

For each size, a fresh stream of that many snapshots (a real redis-server in a
temp folder, written as the bridge writes them) is reported once with
``run_drift_report``: read from the checkpoint, Evidently (4 columns, pinned
K-S), HTML + JSON written, status rows in SQLite, checkpoint advanced and
stream trimmed. The reference is a fixed 5,000-row frame (what
``TrainingReference`` caches), so MLflow is not part of the figure. Reported:
wall time per stage, the peak RSS growth during the report (0 when the
setup, which holds the embeddings, peaked higher) and the process's peak RSS
(tracemalloc is left off: it slowed the read threefold). Each size runs in its own process so the figures do not mix.

    .venv/bin/python bench/drift_report.py [--sizes 10000 100000]

Target (issue 7): at most 10 s at 100,000. Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import free_port


def one(size: int) -> dict[str, float]:
    import evidently.metrics  # noqa: F401  # import cost (~5 s) is not the report's
    import redis
    import sqlalchemy

    from examlops.monitoring.drift import embedding_stats
    from examlops.monitoring.drift_report import Reference, run_drift_report
    from examlops.monitoring.drift_store import SqlDriftStore
    from examlops.monitoring.snapshot_projection import ProjectedSnapshotReader
    from examlops.monitoring.snapshots import MODELS, SnapshotStream, snapshot_of
    from examlops.platform.redis_server import EmbeddedRedis
    from examlops.registry.synthetic import make_dataset

    with tempfile.TemporaryDirectory(prefix="bench-drift-") as tmp:
        root = Path(tmp)
        server = EmbeddedRedis(root / "redis", free_port())
        server.start()
        try:
            client = redis.Redis.from_url(server.url, decode_responses=True)
            emb, nodes, y = make_dataset(size, dim=384, seed=1, shift=0.3)
            pipe = client.pipeline(transaction=False)
            for i in range(size):
                reply = {"alias": "Production", "version": "1", "run_id": "r", "prediction": float(y[i])}
                snap = snapshot_of(
                    model="JPCP", reply=reply, status=200, embedding=list(emb[i]), node_count=int(nodes[i]),
                    job_id=str(i), user_id="bench", ts=1_700_000_000.0 + i,
                )  # fmt: skip
                pipe.xadd(snap.side_write().stream, snap.fields())
                if i % 5000 == 4999:
                    pipe.execute()
            pipe.sadd(MODELS, "jpcp")
            pipe.execute()
            del emb
            ref_emb, _, ref_y = make_dataset(5_000, dim=384, seed=2)
            frame = embedding_stats(ref_emb)
            frame.insert(0, "prediction", ref_y)
            reference = Reference("JPCP", "1", "bench reference", frame)

            class Fixed:
                def reference(self, model: str) -> Reference:
                    return reference

            engine = sqlalchemy.create_engine(f"sqlite:///{root / 'bench.db'}")
            from sqlmodel import SQLModel

            SQLModel.metadata.create_all(engine)
            stages: dict[str, float] = {}
            last = [time.perf_counter()]

            def mark(stage: str) -> None:
                now = time.perf_counter()
                stages[f"before_{stage}"] = now - last[0]
                last[0] = now

            rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            t0 = time.perf_counter()
            report = run_drift_report(
                "JPCP", ProjectedSnapshotReader(SnapshotStream(client)), Fixed(), SqlDriftStore(engine), root / "drift",
                max_rows=max(size, 200_000), on_progress=mark,
            )  # fmt: skip
            wall = time.perf_counter() - t0
            rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            assert report is not None and report.window.rows == size
            return {
                "snapshots": size,
                "wall_s": round(wall, 2),
                "read_s": round(stages["before_evidently"], 2),
                "evidently_s": round(stages["before_save"], 2),
                "save_store_advance_s": round(wall - sum(stages.values()), 2),
                "rss_growth_mib": round((rss_after - rss_before) / 1024, 1),
                "process_peak_rss_mib": round(rss_after / 1024, 1),
                "html_mib": round(report.html_path.stat().st_size / 2**20, 1),
                "prediction_drift": float(report.prediction.drifted),
                "input_drift": float(report.input.drifted),
            }
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return
    np.set_printoptions(suppress=True)
    for size in args.sizes:
        out = subprocess.run(
            [sys.executable, __file__, "--one", str(size)], check=True, capture_output=True, text=True
        ).stdout
        print(json.dumps(json.loads(out.strip().splitlines()[-1])))


if __name__ == "__main__":
    main()
