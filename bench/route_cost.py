"""CPU of one call through FastAPI's own route class against ``api.lean.LeanRoute``, in one run.

One FastAPI app holds the same endpoint (read the body, answer a JSON body) twice, at
``/fastapi/{model}/predict`` (``APIRoute``: the endpoint takes the request alone, as the hot routes do) and
at ``/lean/{model}/predict`` (``LeanRoute``), behind ``--routes`` other routes, as serving's app has them.
Each call is one ASGI call of the app with a JPCP-sized body (no server, no socket: what is left is
FastAPI's and Starlette's own work). The variants alternate over ``--rounds`` rounds of ``--calls`` calls;
printed: the median CPU time (``time.thread_time``) per call of each, and their difference.

    PYTHONPATH=. .venv/bin/python bench/route_cost.py [--rounds 7] [--calls 3000] [--routes 30]

Figures only: nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Request, Response

from examlops.api.lean import LeanRoute


def build(routes: int) -> FastAPI:
    app = FastAPI()
    others = APIRouter()
    for index in range(routes):
        others.add_api_route(f"/other{index}/{{name}}", lambda name: {"name": name}, methods=["GET"])

    async def endpoint(request: Request) -> Response:
        body = orjson.loads(await request.body())
        return Response(orjson.dumps({"model": request.path_params["model"], "rows": len(body["embedding"])}))

    plain, lean = APIRouter(), APIRouter(route_class=LeanRoute)
    plain.add_api_route("/fastapi/{model}/predict", endpoint, methods=["POST"])
    lean.add_api_route("/lean/{model}/predict", endpoint, methods=["POST"])
    for router in (others, plain, lean):
        app.include_router(router)
    return app


async def call(app: FastAPI, path: str, body: bytes) -> None:
    scope: dict[str, Any] = {
        "type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "root_path": "", "scheme": "http", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000),
        "http_version": "1.1", "asgi": {"version": "3.0"},
    }  # fmt: skip
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(scope, receive, send)
    if status != [200]:
        raise SystemExit(f"{path} answered {status}")


async def measure(rounds: int, calls: int, routes: int) -> dict[str, list[float]]:
    app = build(routes)
    body = orjson.dumps({"embedding": [0.01] * 384, "node_count": 12})
    paths = {"fastapi": "/fastapi/JPCP/predict", "lean": "/lean/JPCP/predict"}
    for path in paths.values():  # warm
        for _ in range(200):
            await call(app, path, body)
    figures: dict[str, list[float]] = {name: [] for name in paths}
    for index in range(rounds):
        order = list(paths.items()) if index % 2 == 0 else list(paths.items())[::-1]
        for name, path in order:
            began = time.thread_time()
            for _ in range(calls):
                await call(app, path, body)
            figures[name].append((time.thread_time() - began) / calls * 1e6)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--routes", type=int, default=30, help="Other routes in the app, matched first.")
    args = parser.parse_args()
    figures = asyncio.run(measure(args.rounds, args.calls, args.routes))
    medians = {name: statistics.median(values) for name, values in figures.items()}
    for name, values in figures.items():
        print(f"{name:>8}: median {medians[name]:6.1f} µs a call (rounds {', '.join(f'{v:.1f}' for v in values)})")
    print(f"LeanRoute saves {medians['fastapi'] - medians['lean']:.1f} µs a call")


if __name__ == "__main__":
    main()
