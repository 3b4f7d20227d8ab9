"""Hedging over real HTTP: the kserve_v2 adapter under the resilience policy, wired through the port, against
a V2 server with a slow tail.

The server (a Starlette app under uvicorn on a free 127.0.0.1 port, in a thread of the test) speaks the
Open Inference Protocol for one model, ``tail``: it answers at once, except every 25th request it receives,
which it holds for 300 ms. Counting requests makes the tail deterministic and tells the test how many
backend calls each run made. The same 150 calls run unhedged, then hedged; the test compares the two runs'
p99 as a ratio, made in one process a second apart, never against a fixed latency.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
import uvicorn
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from examlops.inference import Inference, InferenceSpec, Wiring
from examlops.inference.adapters.kserve_v2 import V2Target
from tests.ports import free_port

pytestmark = pytest.mark.integration

SLOW_EVERY = 25
SLOW_S = 0.3
CALLS = 150
BUDGET_RATIO = 0.15
DEADLINE = timedelta(seconds=2)


class Features(BaseModel):
    x: float


class Doubled(BaseModel):
    y: float


TAIL = InferenceSpec(name="tail", input=Features, output=Doubled)


@dataclass
class TailServer:
    url: str
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_turn(self) -> int:
        with self.lock:
            self.requests += 1
            return self.requests


def v2_app(server: TailServer) -> Starlette:
    async def infer(request: Request) -> JSONResponse:
        body = await request.json()
        if server.take_turn() % SLOW_EVERY == 0:
            await asyncio.sleep(SLOW_S)
        (tensor,) = body["inputs"]
        data = [2 * row[0] for row in tensor["data"]]
        output = {"name": "output-0", "shape": [len(data)], "datatype": "FP64", "data": data}
        return JSONResponse({"model_name": "tail", "id": body.get("id"), "outputs": [output]})

    return Starlette(routes=[Route("/v2/models/tail/infer", infer, methods=["POST"])])


@pytest.fixture
def tail_server() -> Iterator[TailServer]:
    port = free_port()
    server = TailServer(url=f"http://127.0.0.1:{port}")
    uv = uvicorn.Server(uvicorn.Config(v2_app(server), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not uv.started:
        assert time.monotonic() < deadline, "the V2 test server did not start"
        time.sleep(0.01)
    yield server
    uv.should_exit = True
    thread.join(timeout=10)


def p99(latencies: list[float]) -> float:
    return sorted(latencies)[math.ceil(0.99 * len(latencies)) - 1]


async def run_calls(server: TailServer, *, hedging: bool) -> tuple[float, int]:
    """p99 of ``CALLS`` sequential calls through the port, and the backend requests they made."""
    policy = {
        "retry": {"max_attempts": 1},
        "hedge": {"enabled": hedging, "budget_ratio": BUDGET_RATIO, "budget_window_s": 60},
        "breaker": {"enabled": False},
        "shedding": {"enabled": False},
    }
    wiring = Wiring(
        {TAIL.name: V2Target(model="tail", outputs=("y",))}, adapters={"kserve_v2": {"url": server.url}}, policy=policy
    )
    before = server.requests
    latencies = []
    async with Inference.from_wiring(wiring) as inference:
        port = inference.model(TAIL)
        for n in range(CALLS):
            started = time.perf_counter()
            answer = await port.predict(Features(x=n), options={"timeout": DEADLINE})  # TIMEOUT would raise
            latencies.append(time.perf_counter() - started)
            assert answer.y == 2 * n
    return p99(latencies), server.requests - before


async def test_hedging_cuts_the_p99_of_a_real_servers_slow_tail_within_its_budget(tail_server: TailServer) -> None:
    unhedged_p99, unhedged_requests = await run_calls(tail_server, hedging=False)
    hedged_p99, hedged_requests = await run_calls(tail_server, hedging=True)
    assert unhedged_requests == CALLS
    assert unhedged_p99 >= SLOW_S  # 6 of 150 calls were slow: the p99 is one of them
    assert hedged_p99 < unhedged_p99 / 3
    assert CALLS < hedged_requests <= CALLS * (1 + BUDGET_RATIO)  # some hedges, never past the budget
    assert max(unhedged_p99, hedged_p99) < DEADLINE.total_seconds()
