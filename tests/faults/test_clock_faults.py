"""Four bridges and a clock step around the retrain cooldown (libfaketime in two of them).

Every job fails (the serving stand-in answers 500 ``inference_failed``), so the failure windows the four
bridges' recorders share fill at once and each recorder tries to claim the model's retrain. Two bridges run
under libfaketime (``LD_PRELOAD``, their wall clock read from a file each call; ``FAKETIME_DONT_FAKE_MONOTONIC``
keeps their monotonic clock real): mid-load one steps forward (3600 s, past the cooldown; long runs also 400 s)
and one as far back (long runs: back and forth, four times, with a cooldown of 15 s); a process started with the
same environment shows the step, so libfaketime is known to have loaded. Prefect is unreachable, so every
request made stays in the retrain outbox, where the test counts them and watches when each appears (on its
own real clock).

Must hold: at most one retrain request per cooldown across the four bridges despite the step (the cooldown
is a Redis key with a TTL, on Redis's clock, taken in one script); every job answered once and recorded
once (the checker's figures all zero) and every reply the stand-in's ``inference_failed`` (never a
``deadline_exceeded`` the step caused), whatever the step: the bus judges deadlines on Redis's clock
(``examlops.bus.clock``), and the stepped bridges' monotonic clocks stay real.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from examlops.monitoring.retrain import OUTBOX
from tests.faults.checker import check
from tests.faults.cluster import Cluster, drive, until
from tests.faults.conftest import LONG, Reporter
from tests.faults.history import History, Outcome
from tests.ports import free_port

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
REQUIRE_FAKETIME = os.environ.get("EXAMLOPS_REQUIRE_FAKETIME") == "1"
"""Set by CI (.ci/run), where setup.sh installs libfaketime: a missing one fails the clock step, never skips it.
Read at import, before the autouse fixture of ``tests/conftest.py`` clears ``EXAMLOPS_*``."""

pytestmark = pytest.mark.timeout(600 if LONG else 180)


def need_libfaketime(path: Path = LIBFAKETIME, *, required: bool = REQUIRE_FAKETIME) -> None:
    """Nothing when ``path`` exists; else a skip, or a failure when ``required``."""
    if path.exists():
        return
    reason = f"libfaketime is not installed at {path} (scripts/setup.sh installs it)"
    if required:
        pytest.fail(f"{reason}, and EXAMLOPS_REQUIRE_FAKETIME=1")
    pytest.skip(reason)


def test_a_missing_libfaketime_skips_the_clock_step_unless_it_is_required(tmp_path: Path) -> None:
    with pytest.raises(pytest.skip.Exception):
        need_libfaketime(tmp_path / "missing.so", required=False)
    with pytest.raises(pytest.fail.Exception, match="EXAMLOPS_REQUIRE_FAKETIME"):
        need_libfaketime(tmp_path / "missing.so", required=True)


JOBS, CONCURRENCY = (3000, 16) if LONG else (200, 8)
"""At 50 jobs/s: 60 s of load (long), 4 s (short)."""
COOLDOWN_S = 15.0 if LONG else 300.0
"""Long: four cooldowns in the run, each with a step; short: one cooldown longer than the run."""
STEP_S = 400
"""Past the short run's 300 s cooldown (long runs only: with 30 s job timeouts, a bridge judging deadlines on its
own wall clock would answer ``deadline_exceeded`` after such a step, which the checker alone does not count as
lost; the reply-code check below catches it)."""
BIG_STEP_S = 3600
"""Past what a bridge judging jobs on its own wall clock could bear (a job expired 600 s ago, or due more than
3600 s ahead, is dead-lettered): the bus's deadlines are on Redis's clock, so no step of a bridge's matters."""
EXPECTED_CODE = "inference_failed"
"""The only reply the stand-in gives; any other code (``deadline_exceeded``...) is a job the step spoiled."""
WINDOW = 10


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    need_libfaketime()
    cluster = Cluster(tmp_path)
    try:
        cluster.serving(delay_s=0.02, fail=True)
        yield cluster
    finally:
        cluster.close()


def faked(clock_file: Path) -> dict[str, str]:
    """The environment of a bridge whose wall clock is ``clock_file``'s offset ("+0", "+3600"...), from +0."""
    clock_file.write_text("+0\n")
    return faked_env(clock_file)


SLEEP_FIX = Path(__file__).with_name("faketime")
"""A ``sitecustomize`` that works around libfaketime's broken ``time.sleep`` (its docstring says why)."""


def faked_env(clock_file: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(SLEEP_FIX), os.environ.get("PYTHONPATH", "")) if p)
    return {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME_TIMESTAMP_FILE": str(clock_file),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": path,
    }


async def faked_offset(clock_file: Path) -> float:
    """How far a process started with ``faked(clock_file)``'s environment sees its wall clock from ours: proves
    libfaketime really loaded and reads the file (and that such a process can sleep)."""
    env = {**os.environ, **faked_env(clock_file)}
    code = "import time; time.sleep(0.01); print(time.time())"
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", code, env=env, stdout=asyncio.subprocess.PIPE)
    out, _ = await child.communicate()
    return float(out) - time.time()


async def watch(url: str, seen: dict[str, float], stop: asyncio.Event) -> None:
    """Each retrain request's key -> when it first appeared in the outbox (this process's monotonic clock)."""
    with redis.Redis.from_url(url, decode_responses=True) as client:
        while not stop.is_set():
            try:
                for key in await asyncio.to_thread(client.hkeys, OUTBOX):
                    seen.setdefault(key, time.monotonic())
            except redis.ConnectionError:
                pass
            await asyncio.sleep(0.05)


STEPS = [STEP_S, BIG_STEP_S] if LONG else [BIG_STEP_S]


@pytest.mark.parametrize("step_s", STEPS)
async def test_four_bridges_and_a_clock_step_ask_for_one_retrain_per_cooldown(
    cluster: Cluster, report: Reporter, step_s: int
) -> None:
    common = {
        "EXAMLOPS_FAILURE__WINDOW": str(WINDOW),
        "EXAMLOPS_FAILURE__COOLDOWN_S": str(COOLDOWN_S),
        "EXAMLOPS_PREFECT__API_URL": f"http://127.0.0.1:{free_port()}/api",  # nothing listens: Prefect down
        # Four bridges connect to the one-process stand-in under load: the fault cluster's 1 s connect timeout
        # can run out on two busy cores, which is load, not the clock step this test is about.
        "EXAMLOPS_HTTP__CONNECT_TIMEOUT_S": "5",
    }
    clocks = [cluster.home / "clock-ahead", cluster.home / "clock-behind"]
    bridges = [cluster.bridge(concurrency=8, wait=False, env={**common, **faked(c)}) for c in clocks]
    bridges += [cluster.bridge(concurrency=8, wait=False, env=common) for _ in range(2)]
    for bridge in bridges:
        bridge.wait_logged(" ready:")
    steps = 4 if LONG else 1
    history = History()
    seen: dict[str, float] = {}
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(cluster.redis.url, seen, stop))
    started = time.monotonic()
    offsets: list[tuple[float, float]] = []
    async with cluster.client() as client:
        load = asyncio.create_task(drive(history, client, jobs=JOBS, concurrency=CONCURRENCY))
        for k in range(steps):
            await until(lambda k=k: history.count_closed() >= (k + 1) * JOBS // (steps + 1))
            history.mark(f"fault:clock_step_{k}")
            sign = 1 if k % 2 == 0 else -1  # long runs step back and forth
            ahead = step_s if sign > 0 else 0
            clocks[0].write_text(f"+{ahead}\n")
            clocks[1].write_text(f"-{ahead}\n")
            offsets += [(ahead, await faked_offset(clocks[0])), (-ahead, await faked_offset(clocks[1]))]
        await load
    elapsed = time.monotonic() - started
    await asyncio.sleep(1.0)  # the last recorder batch's claim
    stop.set()
    await watcher
    figures = check(history, cluster.redis.url, cluster.settings)
    with redis.Redis.from_url(cluster.redis.url, decode_responses=True) as r:
        requests = len(r.hkeys(OUTBOX))
    gaps = sorted(seen.values())
    spacing = [round(b - a, 1) for a, b in itertools.pairwise(gaps)]
    report(
        "four bridges, clock step around the retrain cooldown",
        f"{JOBS} jobs, c={CONCURRENCY}, every job a model failure, window {WINDOW}, cooldown {COOLDOWN_S:g} s, "
        "4 bridges",
        f"{steps} x a {step_s} s step of the wall clock in two bridges (one ahead, one behind); Prefect down; "
        f"{requests} retrain requests in {elapsed:.0f} s, spaced {spacing} s",
        figures,
    )
    assert figures.violations() == []
    assert all(abs(seen_s - wanted_s) < 60 for wanted_s, seen_s in offsets), offsets
    first_step = history.marked("fault:")[0]

    def codes(before: bool) -> set[str]:
        ops = [op for op in history.operations if op.completed is not None and (op.completed < first_step) == before]
        return {(op.value or {}).get("code", str(op.outcome)) for op in ops}

    # A `pipeline_unavailable` is load, not the step: the hop's connect timeout to the one-process stand-in can
    # run out with four bridges connecting under load (CI met one after the step too). The step cannot cause
    # one: the hop times its connect on the monotonic clock, which the stepped bridges keep
    # (FAKETIME_DONT_FAKE_MONOTONIC). So every reply is the model failure or such a connect timeout, before
    # the step and after it, and after it the model failure is still answered.
    load = {EXPECTED_CODE, "pipeline_unavailable"}
    assert codes(before=True) <= load, codes(before=True)
    unavailable = [op.value for op in history.operations if (op.value or {}).get("code") == "pipeline_unavailable"]
    assert all("(ConnectTimeout)" in str(value.get("error")) for value in unavailable if value), unavailable
    assert EXPECTED_CODE in codes(before=False) <= load, codes(before=False)
    # A step that broke the stepped bridges' hops would fail about half the calls after it, not a few.
    after = [op for op in history.operations if op.completed is not None and op.completed >= first_step]
    timeouts = sum(1 for op in after if (op.value or {}).get("code") == "pipeline_unavailable")
    assert timeouts <= max(1, len(after) // 20), (timeouts, len(after))
    assert 1 <= requests <= math.floor(elapsed / COOLDOWN_S) + 1
    assert len(seen) == requests
    assert all(bridge.alive() for bridge in bridges)
    assert history.load_around_faults(good=lambda op: op.outcome is Outcome.OK) == []  # every answer an error
    # A stepped bridge stops on SIGTERM by itself, its recording child too (not killed after 10 s), and none of
    # its threads died.
    for bridge in bridges:
        assert bridge.stop(20) == 0, bridge.logged()[-3000:]
        assert "did not stop cleanly" not in bridge.logged() and "Exception in thread" not in bridge.logged()
