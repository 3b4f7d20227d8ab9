"""Each hop of a bus job behind the fault proxy: the client's Redis, the bridges' Redis, the bridges' serving.

One scenario per hop, under paced load: latency with jitter, then a black hole
that holds every connection (and then resets them, as a partition that ends
in timeouts does), then resets of every new connection for a while, then
healed. A held Redis command may have run without its answer coming back:
the bus's scripts are idempotent by job id and finish token, so the checker
must still find every job answered and recorded once.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.faults.checker import check
from tests.faults.cluster import Cluster, busy, drive, until
from tests.faults.conftest import LONG, Reporter
from tests.faults.history import History
from tests.faults.proxy import FaultProxy

pytestmark = pytest.mark.timeout(600 if LONG else 180)

ROUNDS = 3 if LONG else 1
HOPS = ("client-redis", "bridge-redis", "bridge-serving")
RUNS = [(hop,) for hop in HOPS] if LONG else [HOPS]
"""Long: one run per hop, faulted ROUNDS times. Short: one run with every hop behind a proxy, faulted in turn."""
LATENCY_S, BLACKHOLE_S, RESETS_S = (1.5, 3.0, 1.0) if LONG else (1.0, 2.5, 0.5)
FAULT_S = LATENCY_S + BLACKHOLE_S + RESETS_S
CONCURRENCY = 16 if LONG else 8
JOBS = int(50 * (FAULT_S * ROUNDS * (len(HOPS) if not LONG else 1) + 4))
"""At 50 jobs/s the load outlasts the faults by a few seconds."""


async def inject(proxy: FaultProxy, history: History, hop: str) -> None:
    """Latency and jitter, a black hole ended by resets, new connections reset, then healed (FAULT_S)."""
    await busy(history)  # so each fault starts on jobs in flight (a 20 ms serving leaves idle gaps)
    history.mark(f"fault:{hop}:latency")
    proxy.latency_s, proxy.jitter_s = 0.1, 0.05
    await asyncio.sleep(LATENCY_S)
    proxy.clear()
    history.mark(f"fault:{hop}:blackhole")
    proxy.blackhole = True
    await asyncio.sleep(BLACKHOLE_S)
    proxy.reset_all()
    proxy.reset_new = True
    proxy.blackhole = False
    history.mark(f"fault:{hop}:resets")
    await asyncio.sleep(RESETS_S)
    proxy.clear()
    history.mark(f"heal:{hop}")


@pytest.mark.parametrize("hops", RUNS, ids="+".join)
async def test_hops_behind_latency_a_black_hole_and_resets_lose_and_double_nothing(
    cluster: Cluster, report: Reporter, hops: tuple[str, ...]
) -> None:
    with (
        FaultProxy("127.0.0.1", cluster.redis.port, seed=1) as client_redis,
        FaultProxy("127.0.0.1", cluster.redis.port, seed=2) as bridge_redis,
        FaultProxy("127.0.0.1", cluster.serving_port, seed=3) as bridge_serving,
    ):
        proxies = {"client-redis": client_redis, "bridge-redis": bridge_redis, "bridge-serving": bridge_serving}
        cluster.bridges(
            2,
            redis_url=f"redis://127.0.0.1:{bridge_redis.port}/0" if "bridge-redis" in hops else None,
            serving_port=bridge_serving.port if "bridge-serving" in hops else None,
        )
        client_url = f"redis://127.0.0.1:{client_redis.port}/0" if "client-redis" in hops else None
        history = History()
        async with cluster.client(client_url) as client:
            load = asyncio.create_task(drive(history, client, jobs=JOBS, concurrency=CONCURRENCY, timeout_s=20))
            await until(lambda: history.count_closed() >= 100)
            for k in range(ROUNDS):
                for hop in hops:
                    await inject(proxies[hop], history, hop if ROUNDS == 1 else f"{hop}:{k}")
            await load
        figures = check(history, cluster.redis.url, cluster.settings)
        cluster.stop_children()  # while their way to Redis is still open: they drain instead of retrying
    report(
        f"{' + '.join(hops)} behind the fault proxy",
        f"{JOBS} jobs, c={CONCURRENCY}, 50/s",
        f"{ROUNDS} x per hop, in turn: latency 100±50 ms {LATENCY_S:g} s, black hole {BLACKHOLE_S:g} s then reset, "
        f"new connections reset {RESETS_S:g} s",
        figures,
    )
    assert figures.violations() == []
    assert history.load_around_faults() == []
