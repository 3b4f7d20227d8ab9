"""The floor of an early refusal's time on this machine: the bench's client against a server that only refuses
(issue 17's bound: early refusals answered with p99 under 10 ms).

``bench/overload.py`` measures an early refusal from the client, which shares the two cores with serving and
its predict worker. This runs the same open-loop client (``openloop``, the same bodies) against the least a
server can do on the same HTTP stack as serving (uvicorn with uvloop and httptools): read the body, parse
its JSON, answer 503 with a refusal body. Each round runs the rates of ``--rates`` twice, without and then
with a stand-in for the predict worker: a process running the overload bench's k-NN (``--train-rows`` rows)
on batches of 32 without pause, one BLAS thread, as the worker does when the pool is saturated. What the
client measures here is what the machine, the client and the HTTP stack cost a refusal; the rest of what
``overload.py`` shows is serving's own.

    .venv/bin/python bench/refusal_floor.py [--rates 326 652 1304] [--seconds 6] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo import bodies
from openloop import open_loop
from procs import answers, free_port, quantile, start, stop, wait_until

REFUSAL = orjson.dumps({"error": "over budget", "code": "refused", "refused": "budget", "estimate_ms": 400.0})
WIDTH = 385
"""The demo models' 384-value embedding and the node count: the heavy model's width (``overload.heavy_version``)."""
SINGLE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


async def refuse_everything(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def, type-arg]
    """An ASGI app: 200 on GET (readiness), else the body read and parsed, then a 503 refusal."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    status, out = (200, b"{}") if scope["method"] == "GET" else (503, REFUSAL)
    if body:
        orjson.loads(body)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(out)), (b"retry-after", b"1")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": out})


def serve(port: int) -> None:
    import uvicorn

    uvicorn.run(refuse_everything, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                loop="uvloop", http="httptools")  # fmt: skip


def burn(train_rows: int) -> None:
    import numpy as np
    from overload import heavy_model

    model = heavy_model(train_rows, WIDTH)
    batch = np.random.default_rng(8).normal(0, 0.05, (32, WIDTH))
    while True:
        model.predict(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[326.0, 652.0, 1304.0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--train-rows", type=int, default=100_000)
    parser.add_argument("--role", choices=["serve", "burn"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "serve":
        serve(args.port)
        return
    if args.role == "burn":
        burn(args.train_rows)
        return

    env = {**os.environ, **SINGLE_THREAD}
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    port = free_port()
    server = start([sys.executable, __file__, "--role", "serve", "--port", str(port)], env, logs / "refusal-floor.log")
    pool = [orjson.dumps({**b, "budget_ms": 300.0}) for b in bodies(384, 64, seed=1)]

    def pick(rng: random.Random) -> tuple[str, float, bytes]:
        return "tight", 300.0, pool[rng.randrange(len(pool))]

    print(f"{'round':>5} {'rate':>6} {'worker stand-in':>15} {'refusals':>8} {'p50 ms':>7} {'p90 ms':>7} "
          f"{'p99 ms':>7} {'max ms':>7}")  # fmt: skip
    try:
        wait_until(answers(f"http://127.0.0.1:{port}/"), "the refusing server", proc=server)
        for round_ in range(1, args.rounds + 1):
            for busy in (False, True):
                burner = None
                if busy:
                    argv = [sys.executable, __file__, "--role", "burn", "--train-rows", str(args.train_rows)]
                    burner = start(argv, env, logs / "refusal-floor-burn.log")
                    time.sleep(5)  # its model built, its loop running
                try:
                    for rate in args.rates:
                        sent = asyncio.run(open_loop(f"http://127.0.0.1:{port}/refuse", rate, args.seconds, pick,
                                                     seed=round_))  # fmt: skip
                        ms = [r.latency_ms for r in sent if r.status == 503]
                        print(f"{round_:>5} {rate:>6g} {'running' if busy else 'none':>15} {len(ms):>8} "
                              f"{quantile(ms, 0.5):>7.2f} {quantile(ms, 0.9):>7.2f} {quantile(ms, 0.99):>7.2f} "
                              f"{max(ms, default=float('nan')):>7.1f}", flush=True)  # fmt: skip
                finally:
                    if burner is not None:
                        stop(burner)
    finally:
        stop(server)


if __name__ == "__main__":
    main()
