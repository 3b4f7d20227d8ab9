"""Clients that resend, with the same job id, every job whose outcome is unknown, through black holes longer
than their timeout.

Two bridges reach Redis and serving through fault proxies. The client waits 1.5 s per try; a black hole of
3 s on the hop to serving, then on the bridges' way to Redis, makes tries time out (unknown: the job may or
may not have been done) while the bridges still hold them: a reply script held on its way to Redis runs once
the black hole ends, after its client gave up. Each unknown try is sent again with the same job id, up to 8
times. The bus must answer each job id once: a retry of an answered job id gets that one reply again, marked
``resent`` (``bus/README.md``), and is never served or recorded again. The checker then proves no unknown
job applied twice (two first replies, or two snapshots or events, for one job id), every resent reply the
same answer as the first, nothing lost or recorded twice; and that the faults hit tries in flight.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.faults.checker import check
from tests.faults.cluster import Cluster, busy, drive, until
from tests.faults.conftest import LONG, Reporter
from tests.faults.history import History, Outcome
from tests.faults.proxy import FaultProxy

pytestmark = pytest.mark.timeout(600 if LONG else 180)

ROUNDS = 3 if LONG else 1
TIMEOUT_S, BLACKHOLE_S, RETRIES = 1.5, 3.0, 8
"""The client's wait per try is shorter than each black hole; 8 retries of 1.5 s outlast one."""
JOBS = int(50 * (2 * (BLACKHOLE_S + 1) * ROUNDS + 4))
"""At 50 jobs/s the load outlasts the faults by a few seconds."""


async def blackhole(proxy: FaultProxy, history: History, name: str) -> None:
    await busy(history)
    history.mark(f"fault:{name}:blackhole")
    proxy.blackhole = True
    await asyncio.sleep(BLACKHOLE_S)
    proxy.reset_all()  # the held connections end as a partition's do: reset
    proxy.blackhole = False
    history.mark(f"heal:{name}")
    await asyncio.sleep(1.0)


async def test_clients_resending_unknown_jobs_with_the_same_id_get_one_answer_each_never_applied_twice(
    cluster: Cluster, report: Reporter
) -> None:
    with (
        FaultProxy("127.0.0.1", cluster.redis.port, seed=4) as to_redis,
        FaultProxy("127.0.0.1", cluster.serving_port, seed=5) as to_serving,
    ):
        cluster.bridges(2, redis_url=f"redis://127.0.0.1:{to_redis.port}/0", serving_port=to_serving.port)
        history = History()
        async with cluster.client() as client:
            load = asyncio.create_task(
                drive(history, client, jobs=JOBS, concurrency=32, timeout_s=TIMEOUT_S, retries=RETRIES)
            )
            await until(lambda: history.count_closed() >= 50)
            for k in range(ROUNDS):
                await blackhole(to_serving, history, f"bridge-serving:{k}")
                await blackhole(to_redis, history, f"bridge-redis:{k}")
            await load
        figures = check(history, cluster.redis.url, cluster.settings)
        cluster.stop_children()  # while their way to Redis is still open: they drain instead of retrying
    report(
        "clients resend unknown jobs with the same id, black holes longer than their timeout",
        f"{JOBS} job ids, c=32, 50/s, client timeout {TIMEOUT_S:g} s, up to {RETRIES} resends per id",
        f"{ROUNDS} x a {BLACKHOLE_S:g} s black hole on the hop to serving, then on the bridges' way to Redis",
        figures,
    )
    assert figures.violations() == []
    assert history.load_around_faults() == []
    keys = {op.key for op in history.operations}
    retried = {op.key for op in history.operations if op.outcome is Outcome.UNKNOWN}
    answered = {op.key for op in history.operations if op.outcome is Outcome.OK}
    # The faults made tries unknown and their resends found the job id answered: the property was exercised.
    assert retried and figures.resent
    assert answered == keys, f"job ids never answered after {RETRIES} resends: {sorted(keys - answered)[:5]}"
