"""Overload at twice the measured capacity, through the bus to the real serving.

Real processes: a redis-server, two bridges, `exa serve start` with JPCP alone (its demo versions), its Production a
model that sleeps (``PREDICT_S``, batches of ``BATCH``, one worker: see ``PREDICT_S``).
First the capacity is measured: a burst of ``BURST`` jobs sent at once, answered per second; then
an open-loop load is offered at twice that rate for ``OVERLOAD_S`` (each job sent on its schedule whatever
the replies; each with a budget of ``BUDGET_MS``), so queues grow until admission control refuses.

Must hold: the checker's figures all zero (no job lost or answered twice; every answered job recorded once,
no refusal recorded); every refusal carries the documented body (``code`` ``refused``, ``refused``
``budget`` or ``late``, ``retry_after_s``, the job's ``budget_ms`` and its ``budget_remaining_ms``,
``estimate_ms`` for a ``budget`` refusal, which may be null: see ``without_estimate``); no other error
than a refusal, the budget's end (``deadline_exceeded``) or the hop's timeout (``ALLOWED``); and the
overload was real (some jobs were refused or ran out of budget).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

from examlops.bus.client import BusClient
from examlops.core.settings import Settings
from examlops.registry.demo import seed_demo
from tests.faults.catalog import jpcp_only
from tests.faults.checker import check
from tests.faults.cluster import ADDRESS, PAYLOAD, Child, Cluster, examlops_env, wait_ready
from tests.faults.conftest import LONG, Reporter
from tests.faults.history import History, Operation
from tests.integration import sleepy

pytestmark = [
    pytest.mark.timeout(900 if LONG else 300),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning"),
]

BURST = 2000 if LONG else 300
"""Short: 300 jobs at once still queue faster than serving drains them (about 200/s), so the drain measured
between the 10th and the 90th answer runs with full batches."""
OVERLOAD_S = 60.0 if LONG else 3.0
PER_CLIENT = 5000
"""Jobs per client at most: each client's reply stream holds 10 000 entries."""
BUDGET_MS = 1000.0
TIMEOUT_S = 30.0
ALLOWED = {None, "refused", "deadline_exceeded", "pipeline_unavailable"}
"""``pipeline_unavailable``: the bridge's hop read timeout (2 s in this suite) ran out while serving held the
job, past its 1 s budget (seen: 26 of 960 jobs; bench/RESULTS.md, not analysed further). Answered once and
recorded all the same."""


PREDICT_S, BATCH = 0.02, 4
"""JPCP's Production is a model whose predict sleeps 20 ms, in batches of at most 4 on one worker: serving's
capacity (about 200 jobs/s) is below what this machine's client, bridges and Redis carry (about 700/s), so
serving is the bottleneck the overload is about, not the CPU the processes share."""


def sleepy_production(settings: Settings) -> None:
    import mlflow
    import mlflow.sklearn

    cloudpickle.register_pickle_by_value(sleepy)
    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    model = sleepy.SleepyRegressor(PREDICT_S).fit(np.zeros((2, 385)), np.zeros(2))
    client = mlflow.MlflowClient(settings.mlflow_tracking_uri)
    artifacts = (settings.mlflow_artifact_root / "faults").as_uri()
    with mlflow.start_run(experiment_id=client.create_experiment("examlops-faults", artifact_location=artifacts)):
        info = mlflow.sklearn.log_model(
            model, name="model", serialization_format="cloudpickle", registered_model_name="JPCP"
        )
    version = str(info.registered_model_version)
    client.set_registered_model_alias("JPCP", "Production", version)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path)
    try:
        folder, catalog = jpcp_only(tmp_path / "catalog")
        seed_demo(cluster.settings, catalog)
        sleepy_production(cluster.settings)
        env = examlops_env(
            tmp_path,
            EXAMLOPS_REDIS__URL=cluster.redis.url,
            EXAMLOPS_CATALOG_DIR=str(folder),
            EXAMLOPS_PREDICT__WORKERS="1",
            EXAMLOPS_BATCH__MAX_SIZE=str(BATCH),
            EXAMLOPS_HOTSET__RELOAD_POLL_S="0",
        )
        argv = [sys.executable, "-m", "examlops.cli.main", "serve", "start", "--port", str(cluster.serving_port)]
        serving = Child("serving", argv, env, tmp_path / "serving.log")
        cluster.children.append(serving)
        wait_ready(f"http://127.0.0.1:{cluster.serving_port}", serving)
        bridges = [
            cluster.bridge(concurrency=32, wait=False, env={"EXAMLOPS_CATALOG_DIR": str(folder)}) for _ in range(2)
        ]
        for bridge in bridges:
            bridge.wait_logged(" ready:")
        yield cluster
    finally:
        cluster.close()


async def measure(history: History, client: BusClient) -> float:
    """Jobs answered per second when ``BURST`` jobs are sent at once (the queue never empties, so serving's
    batching runs full): the capacity. A closed loop of a few clients measures their latency instead."""
    ops = await asyncio.gather(
        *(history.bus_request(client, ADDRESS, PAYLOAD, TIMEOUT_S, f"measure-{i}") for i in range(BURST))
    )
    done = sorted(op.completed for op in ops if op.answered_ok and op.completed is not None)
    first, last = done[len(done) // 10], done[len(done) * 9 // 10]  # the drain, not the burst's send
    return (len(done) * 8 // 10) / (last - first)


async def offer(history: History, clients: list[BusClient], rate_per_s: float, jobs: int) -> float:
    """``jobs`` jobs at ``rate_per_s``, each sent on its own schedule whatever the replies (open loop),
    spread over ``clients`` (each reply stream holds 10 000 entries); the rate achieved."""
    start = time.monotonic()
    sent_last = start

    async def one(i: int) -> None:
        nonlocal sent_last
        await asyncio.sleep(max(0.0, start + i / rate_per_s - time.monotonic()))
        sent_last = max(sent_last, time.monotonic())
        client = clients[i % len(clients)]
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
        and (body.get("refused") != "budget" or isinstance(body.get("estimate_ms"), int | float | None))
    )


def without_estimate(body: dict[str, Any]) -> bool:
    """A ``budget`` refusal with ``estimate_ms`` null: the budget ran out before the call reached serving's
    queue (``pipeline._enter``), so no estimate decided it. Counted and reported: bus/README.md lists
    ``estimate_ms`` with every refusal."""
    return body.get("refused") == "budget" and body.get("estimate_ms") is None


async def test_twice_the_capacity_open_loop_loses_nothing_and_refuses_with_the_documented_body(
    cluster: Cluster, report: Reporter
) -> None:
    history = History()
    async with cluster.client() as client:
        capacity = await measure(history, client)
    assert capacity > 0
    jobs = int(2 * capacity * OVERLOAD_S)
    clients = [cluster.client() for _ in range(-(-jobs // PER_CLIENT))]
    try:
        history.mark("fault:overload")
        achieved = await offer(history, clients, 2 * capacity, jobs)
    finally:
        for client in clients:
            await client.close()
    figures = check(history, cluster.redis.url, cluster.settings)
    over: list[Operation] = [op for op in history.operations if op.key.startswith("over-")]
    codes = Counter((op.value or {}).get("code") if op.value else str(op.outcome) for op in over)
    refusals = [op.value for op in over if op.value and op.value.get("code") == "refused"]
    report(
        "overload at 2x capacity, open loop",
        f"capacity {capacity:.0f} jobs/s (a burst of {BURST}); offered "
        f"{2 * capacity:.0f}/s open loop (achieved {achieved:.0f}/s) for {OVERLOAD_S:g} s, budget {BUDGET_MS:g} ms, "
        f"2 bridges, real serving (1 worker, batches of {BATCH}, predict {PREDICT_S * 1000:.0f} ms)",
        f"{len(over)} jobs at 2x capacity; replies by code {dict(codes)}; "
        f"{sum(1 for b in refusals if b and without_estimate(b))} budget refusals without an estimate",
        figures,
    )
    assert figures.violations() == []
    undocumented = [b for b in refusals if b is not None and not documented_refusal(b)]
    assert undocumented == [], (len(undocumented), undocumented[:3])
    assert set(codes) <= ALLOWED, codes
    assert codes["refused"] + codes["deadline_exceeded"] > 0, "no overload happened"
