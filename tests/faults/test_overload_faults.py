"""Overload at twice the measured capacity, through the bus to the real serving.

Real processes: a redis-server, two bridges, `exa serve start` with the demo models (two predict workers).
First the capacity is measured: closed-loop bus requests, ``CLOSED_C`` at a time, for ``MEASURE_S``; then
an open-loop load is offered at twice that rate for ``OVERLOAD_S`` (each job sent on its schedule whatever
the replies; each with a budget of ``BUDGET_MS``), so queues grow until admission control refuses.

Must hold: the checker's figures all zero (no job lost or answered twice; every answered job recorded once,
no refusal recorded); every refusal carries the documented body (``code`` ``refused``, ``refused``
``budget`` or ``late``, ``retry_after_s``, the job's ``budget_ms`` and its ``budget_remaining_ms``,
``estimate_ms`` for a ``budget`` refusal); no other error than a refusal or the budget's end
(``deadline_exceeded``); and the overload was real (some jobs were refused or ran out of budget).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from examlops.bus.client import BusClient
from tests.faults.checker import check
from tests.faults.cluster import ADDRESS, PAYLOAD, Cluster
from tests.faults.conftest import LONG, Reporter
from tests.faults.history import History, Operation

pytestmark = [
    pytest.mark.timeout(900 if LONG else 300),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning"),
]

MEASURE_S, OVERLOAD_S = (10.0, 60.0) if LONG else (3.0, 5.0)
CLOSED_C = 16
BUDGET_MS = 1000.0
TIMEOUT_S = 30.0
ALLOWED = {None, "refused", "deadline_exceeded"}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path)
    try:
        cluster.real_serving()
        cluster.bridges(2, concurrency=32)
        yield cluster
    finally:
        cluster.close()


async def measure(history: History, client: BusClient) -> float:
    """Jobs answered per second, ``CLOSED_C`` at a time (each waits for its reply), over ``MEASURE_S``."""
    end = time.monotonic() + MEASURE_S
    answered = 0

    async def worker(w: int) -> None:
        nonlocal answered
        i = 0
        while time.monotonic() < end:
            op = await history.bus_request(client, ADDRESS, PAYLOAD, TIMEOUT_S, f"measure-{w}-{i}")
            answered += op.answered_ok
            i += 1

    started = time.monotonic()
    await asyncio.gather(*(worker(w) for w in range(CLOSED_C)))
    return answered / (time.monotonic() - started)


async def offer(history: History, client: BusClient, rate_per_s: float) -> float:
    """``rate_per_s`` x ``OVERLOAD_S`` jobs, each sent on its own schedule (open loop); the rate achieved."""
    jobs = int(rate_per_s * OVERLOAD_S)
    start = time.monotonic()
    sent_last = start

    async def one(i: int) -> None:
        nonlocal sent_last
        await asyncio.sleep(max(0.0, start + i / rate_per_s - time.monotonic()))
        sent_last = max(sent_last, time.monotonic())
        await history.bus_request(client, ADDRESS, PAYLOAD, TIMEOUT_S, f"over-{i}", budget_ms=BUDGET_MS)

    await asyncio.gather(*(one(i) for i in range(jobs)))
    return jobs / max(sent_last - start, 1e-3)


def documented_refusal(body: dict[str, Any]) -> bool:
    return (
        body.get("code") == "refused"
        and body.get("refused") in ("budget", "late")
        and isinstance(body.get("error"), str)
        and isinstance(body.get("retry_after_s"), int | float)
        and body.get("budget_ms") == BUDGET_MS
        and isinstance(body.get("budget_remaining_ms"), int | float)
        and (body.get("refused") != "budget" or isinstance(body.get("estimate_ms"), int | float))
    )


async def test_twice_the_capacity_open_loop_loses_nothing_and_refuses_with_the_documented_body(
    cluster: Cluster, report: Reporter
) -> None:
    history = History()
    async with cluster.client() as client:
        capacity = await measure(history, client)
        assert capacity > 0
        history.mark("fault:overload")
        achieved = await offer(history, client, 2 * capacity)
    figures = check(history, cluster.redis.url, cluster.settings)
    over: list[Operation] = [op for op in history.operations if op.key.startswith("over-")]
    codes = Counter((op.value or {}).get("code") if op.value else str(op.outcome) for op in over)
    refusals = [op.value for op in over if op.value and op.value.get("code") == "refused"]
    report(
        "overload at 2x capacity, open loop",
        f"capacity {capacity:.0f} jobs/s (closed loop, c={CLOSED_C}, {MEASURE_S:g} s); offered "
        f"{2 * capacity:.0f}/s open loop (achieved {achieved:.0f}/s) for {OVERLOAD_S:g} s, budget {BUDGET_MS:g} ms, "
        "2 bridges, real serving with 2 workers",
        f"{len(over)} jobs at 2x capacity; replies by code {dict(codes)}",
        figures,
    )
    assert figures.violations() == []
    assert [b for b in refusals if not documented_refusal(b)] == []
    assert set(codes) <= ALLOWED, codes
    assert codes["refused"] + codes["deadline_exceeded"] > 0, "no overload happened"
