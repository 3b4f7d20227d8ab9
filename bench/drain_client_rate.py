"""The rate `tests/e2e/test_up_drain.py`'s load client reaches on its own: open-loop arrivals from one asyncio
loop over one shared ``httpx.AsyncClient`` (400 connections), against a trivial ASGI app in a process of its
own, so that what bounds the drain test's rate can be told apart: this client, or serving.

    .venv/bin/python bench/drain_client_rate.py --rates 100 400 800 --seconds 8
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import time
from typing import Any

import httpx
import uvicorn

PAYLOAD = {"model": "JPCP", "embedding": [0.01] * 384, "node_count": 12}
"""The drain test's body size."""


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})


def _serve(port: int) -> None:
    uvicorn.run(_app, host="127.0.0.1", port=port, log_level="error", access_log=False)


async def _load(url: str, rps: int, seconds: float) -> float:
    """Requests a second that went on the wire (request headers written), first to last."""
    wire: list[float] = []

    async def trace(event: str, _info: dict[str, Any]) -> None:
        if event == "http11.send_request_headers.started":
            wire.append(time.monotonic())

    limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        tasks = []
        t0 = time.monotonic()
        for i in range(int(rps * seconds)):
            await asyncio.sleep(max(0.0, t0 + i / rps - time.monotonic()))
            tasks.append(asyncio.create_task(client.post("/", json=PAYLOAD, extensions={"trace": trace})))
        await asyncio.gather(*tasks)
    wire.sort()
    return (len(wire) - 1) / (wire[-1] - wire[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=int, nargs="+", default=[100, 400, 800])
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(port,), daemon=True)
    server.start()
    try:
        time.sleep(3)
        for rps in args.rates:
            reached = asyncio.run(_load(f"http://127.0.0.1:{port}", rps, args.seconds))
            print(f"{rps} req/s asked: {reached:.0f} req/s on the wire")
    finally:
        server.terminate()
        server.join()


if __name__ == "__main__":
    main()
