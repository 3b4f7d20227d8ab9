"""Processes faulted under bus load: a bridge SIGKILLed or SIGSTOPped mid-job, serving killed and restarted.

Two bridges serve one model; the serving stand-in answers after a delay, so
every fault lands on jobs in flight. The checker then proves that no job was
lost, answered twice or recorded twice, and that every answered job was
recorded once: the killed bridge's jobs are reclaimed by the other (after the
reclaim idle time, 5 s here) and its recorder's unsettled records by the other
recorder; a stopped bridge that wakes after its jobs were reclaimed and
answered finds their done keys and writes nothing twice.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator

import pytest

from tests.faults.checker import check
from tests.faults.cluster import Child, Cluster, busy, drive, until, wait_port, wait_ready
from tests.faults.conftest import LONG, Reporter
from tests.faults.history import History

pytestmark = pytest.mark.timeout(600 if LONG else 180)

JOBS, CONCURRENCY = (3000, 16) if LONG else (200, 8)
"""At 50 jobs/s: 60 s of load (long), 4 s (short)."""
DELAY_S = 0.1
"""Serving's answer time: with c=8 there are always jobs in flight in both bridges."""


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One Redis and one serving stand-in for the module's scenarios: each starts its own bridges (stopped when
    it ends, so only its own take jobs over) and uses job ids of its own."""
    cluster = Cluster(tmp_path_factory.mktemp("process-faults"))
    try:
        cluster.serving(delay_s=DELAY_S)
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def cluster(shared: Cluster) -> Iterator[Cluster]:
    """The shared cluster; the bridges a scenario started are stopped after it (SIGTERM: they drain)."""
    before = len(shared.children)
    try:
        yield shared
    finally:
        for child in shared.children[before:]:
            child.stop(10)
        standin = shared.children[0]
        if not standin.alive():  # a scenario replaced it (the real serving's)
            standin.restart()
            wait_port(shared.serving_port, standin)


async def test_a_bridge_sigkilled_mid_job_loses_nothing_while_another_bridge_runs(
    cluster: Cluster, report: Reporter
) -> None:
    kills = 3 if LONG else 1
    doomed = cluster.bridge(concurrency=4, wait=False)
    survivor = cluster.bridge(concurrency=16)
    doomed.wait_logged(" ready:")
    history = History()
    async with cluster.client() as client:
        load = asyncio.create_task(drive(history, client, jobs=JOBS, concurrency=CONCURRENCY, prefix="killed"))
        for k in range(kills):
            await until(lambda k=k: history.count_closed() >= (k + 1) * JOBS // (kills + 2))
            history.mark(f"fault:bridge_sigkill_{k}")
            doomed.kill()  # the bridge and its recording child, holding jobs and records
            if k < kills - 1:
                doomed.restart()
                await asyncio.to_thread(doomed.wait_logged, " ready:", times=k + 2)
        await load
    figures = check(history, cluster.redis.url, cluster.settings)
    report(
        "bridge SIGKILL mid-job, another bridge running",
        f"{JOBS} jobs, c={CONCURRENCY}, serving {DELAY_S * 1000:.0f} ms",
        f"{kills} x SIGKILL of a bridge and its recorder",
        figures,
    )
    assert figures.violations() == []
    assert figures.answered_with_error == 0
    # The kill landed on jobs the doomed bridge held: the survivor took them over, and answers came before and
    # after it.
    assert "reclaimed job" in survivor.logged()
    assert history.load_around_faults() == []


STOPPED_S = 7.0


async def test_a_bridge_stopped_past_the_reclaim_time_and_woken_answers_nothing_twice(
    cluster: Cluster, report: Reporter
) -> None:
    stalled = cluster.bridge(concurrency=4, wait=False)
    survivor = cluster.bridge(concurrency=16)
    stalled.wait_logged(" ready:")
    history = History()
    jobs = JOBS + int(50 * (STOPPED_S + 2))  # the load outlasts the stop: the woken bridge serves again
    async with cluster.client() as client:
        load = asyncio.create_task(drive(history, client, jobs=jobs, concurrency=CONCURRENCY, prefix="stopped"))
        await until(lambda: history.count_closed() >= JOBS // 4)
        history.mark("fault:bridge_sigstop")
        stalled.signal(signal.SIGSTOP)
        await asyncio.sleep(STOPPED_S)  # past the 5 s reclaim idle time: the other bridge takes its jobs over
        stalled.signal(signal.SIGCONT)
        history.mark("heal:bridge_sigcont")
        await load
    figures = check(history, cluster.redis.url, cluster.settings)
    report(
        "bridge SIGSTOP past the reclaim time, then SIGCONT",
        f"{jobs} jobs, c={CONCURRENCY}, serving {DELAY_S * 1000:.0f} ms",
        f"SIGSTOP {STOPPED_S:g} s (reclaim after 5 s)",
        figures,
    )
    assert figures.violations() == []
    assert "reclaimed job" in survivor.logged()  # the stop held jobs, which the other bridge took over
    assert history.load_around_faults() == []


def real_serving(cluster: Cluster) -> Child:
    """`exa serve start` on the serving port, in place of the shared stand-in (stopped; ``cluster`` starts it
    again after the test)."""
    cluster.children[0].stop(10)
    return cluster.real_serving()


SERVINGS = ["stand-in", "real"] if LONG else ["stand-in"]
"""The real serving (`exa serve start`, MLflow, the predict pool) takes minutes of CPU to start on a busy
machine, three times per run: long runs only."""


@pytest.mark.parametrize("kind", SERVINGS)
async def test_serving_sigkilled_and_restarted_with_jobs_in_flight_answers_each_job_once(
    cluster: Cluster, report: Reporter, kind: str
) -> None:
    # The stand-in is the shared one (restarted in place); the real serving takes the stand-in's port.
    serving = cluster.children[0] if kind == "stand-in" else real_serving(cluster)
    cluster.bridges(2)
    kills = 3 if LONG and kind == "stand-in" else 1  # the real serving takes a minute to start again
    history = History()
    async with cluster.client() as client:
        load = asyncio.create_task(drive(history, client, jobs=JOBS, concurrency=CONCURRENCY, prefix=f"serving-{kind}"))
        for k in range(kills):
            await until(lambda k=k: history.count_closed() >= (k + 1) * JOBS // (kills + 2))
            await busy(history)  # the real serving answers in milliseconds: most instants hold no job
            history.mark(f"fault:serving_sigkill_{k}")
            serving.kill()
            await asyncio.sleep(1.0)
            if kind == "stand-in":
                await serving.restart_listening(cluster.serving_port)
            else:
                serving.restart()
                await asyncio.to_thread(wait_ready, f"http://127.0.0.1:{cluster.serving_port}", serving)
            history.mark(f"heal:serving_restarted_{k}")
        await load
    figures = check(history, cluster.redis.url, cluster.settings)
    report(
        f"serving ({kind}) SIGKILL + restart, jobs in flight",
        f"{JOBS} jobs, c={CONCURRENCY}"
        + (f", stand-in {DELAY_S * 1000:.0f} ms" if kind == "stand-in" else ", demo models"),
        f"{kills} x SIGKILL, 1 s down, then its start",
        figures,
    )
    # Jobs in flight or sent while serving is down are answered once, with an error (pipeline unavailable),
    # and recorded: the bridge does not retry a hop (it cannot know whether serving acted on it).
    assert figures.violations() == []
    assert figures.lost == [] and figures.answered_twice == []
    assert history.load_around_faults() == []
