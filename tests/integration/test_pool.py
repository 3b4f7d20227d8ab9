"""The predict pool against real worker processes and test models chosen by their location string."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import numpy as np
import psutil
import pytest

from examlops.core.errors import (
    InferenceFailed,
    InferenceTimeout,
    InvalidInput,
    ModelLoadError,
    PipelineUnavailable,
    VersionNotFound,
    WorkerLost,
)
from examlops.serving import pool_worker
from examlops.serving.pool import ProcessPredictPool

pytestmark = pytest.mark.integration

ROWS = np.arange(3 * 5, dtype=np.float64).reshape(3, 5)
WEIGHTS = np.arange(1.0, 6.0)


class ScriptedModel:
    """Behaves as its location says: ``linear``, ``pid``, ``sleep:<s>``, ``raise``, ``empty``, ``nan``, ``short``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def predict(self, rows: np.ndarray) -> Any:
        if self.kind == "pid":
            return np.full(len(rows), os.getpid())
        if self.kind.startswith("sleep:"):
            time.sleep(float(self.kind.split(":")[1]))
        if self.kind == "raise":
            raise RuntimeError("boom in the model")
        if self.kind == "empty":
            return []
        if self.kind == "nan":
            return np.full(len(rows), np.nan)
        if self.kind == "short":
            return rows.sum(axis=1)[:-1]
        return linear(rows)


def linear(rows: np.ndarray) -> np.ndarray:
    result: np.ndarray = rows @ WEIGHTS + 0.5
    return result


def load_scripted(location: str) -> ScriptedModel:
    if location == "missing":
        raise FileNotFoundError("no artifact at 'missing'")
    if location.startswith("slow-load:"):
        time.sleep(float(location.split(":")[1]))
    return ScriptedModel(location)


def child_processes() -> list[psutil.Process]:
    """Our spawned pool workers: not multiprocessing's resource tracker (one per interpreter), nor any
    other child of the test session (a session-scoped redis-server of the integration tests)."""
    workers = []
    for child in psutil.Process().children():  # the pool spawns its workers as our direct children
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                workers.append(child)
        except psutil.NoSuchProcess:
            continue
    return workers


@pytest.fixture(autouse=True)
def _no_process_left() -> Iterator[None]:
    before = {child.pid for child in child_processes()}  # another test's process is not this test's
    yield
    assert multiprocessing.active_children() == []
    assert [child for child in child_processes() if child.pid not in before] == []


def run_with_pool(
    scenario: Callable[[ProcessPredictPool], Awaitable[None]],
    *,
    loader: Callable[[str], Any] = load_scripted,
    workers: int = 1,
    timeout_s: float = 30.0,
    preload: tuple[str, ...] = (),
) -> None:
    """Start a pool, run the scenario against it, close the pool whatever happened."""

    async def main() -> None:
        pool = ProcessPredictPool(loader, workers=workers, timeout_s=timeout_s, preload=preload)
        await pool.start()
        try:
            await scenario(pool)
        finally:
            await pool.close()
        assert asyncio.all_tasks() == {asyncio.current_task()}  # nothing left running: no reaper, no call

    asyncio.run(main())


async def worker_pid(pool: ProcessPredictPool) -> int:
    return int((await pool.predict("pid", ROWS))[0])


def test_predictions_come_back_in_row_order_and_match_the_model() -> None:
    batches = [np.random.default_rng(seed).normal(size=(32, 5)) for seed in range(40)]

    async def scenario(pool: ProcessPredictPool) -> None:
        await pool.load("linear/1", "linear")
        results = await asyncio.gather(*(pool.predict("linear/1", rows) for rows in batches))
        for rows, result in zip(batches, results, strict=True):
            assert result.dtype == np.float64
            assert result.shape == (32,)
            np.testing.assert_allclose(result, linear(rows))
        assert pool.stats().in_flight == 0

    run_with_pool(scenario, workers=2)


def test_calls_that_find_no_idle_worker_are_served_first_come_first_served() -> None:
    async def scenario(pool: ProcessPredictPool) -> None:
        await pool.load("nap", "sleep:0.02")
        answered: list[int] = []

        async def call(number: int) -> None:
            await pool.predict("nap", ROWS)
            answered.append(number)

        await asyncio.gather(*(call(number) for number in range(8)))
        assert answered == list(range(8))

    run_with_pool(scenario)


async def killed(pid: int, within: float = 2.0) -> bool:
    """Whether ``pid`` is gone (or a zombie) within ``within`` s: SIGKILL takes effect asynchronously."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        await asyncio.sleep(0.01)
    return False


def test_a_prediction_past_the_limit_times_out_and_the_next_call_gets_another_worker_at_once() -> None:
    async def scenario(pool: ProcessPredictPool) -> None:
        await pool.load("slow", "sleep:30")
        await pool.load("pid", "pid")
        stuck = await worker_pid(pool)
        for replaced in (1, 2):  # the second round runs on a spare started after the loads
            slow = asyncio.create_task(pool.predict("slow", ROWS))
            await asyncio.sleep(0.05)
            queued = asyncio.create_task(worker_pid(pool))  # waits: the only worker is stuck
            with pytest.raises(InferenceTimeout, match="slow"):
                await slow
            started = time.monotonic()
            answered_by = await queued
            assert time.monotonic() - started < 5  # sanity bound only: no wait for the stuck worker
            assert answered_by != stuck
            assert await killed(stuck)
            stats = pool.stats()
            assert (stats.workers, stats.replaced, stats.in_flight) == (1, replaced, 0)
            stuck = answered_by

    run_with_pool(scenario, timeout_s=0.5)


def test_a_model_that_raises_gives_inference_failed_and_the_worker_keeps_serving() -> None:
    async def scenario(pool: ProcessPredictPool) -> None:
        await pool.load("raise", "raise")
        await pool.load("pid", "pid")
        before = await worker_pid(pool)
        with pytest.raises(InferenceFailed, match="boom in the model") as failure:
            await pool.predict("raise", ROWS)
        assert failure.value.model_failure
        assert await worker_pid(pool) == before
        assert pool.stats().replaced == 0

    run_with_pool(scenario)


@pytest.mark.parametrize(("kind", "message"), [("empty", "empty"), ("nan", "non-finite"), ("short", "2 values")])
def test_an_empty_short_or_non_finite_result_is_inference_failed(kind: str, message: str) -> None:
    async def scenario(pool: ProcessPredictPool) -> None:
        await pool.load(kind, kind)
        with pytest.raises(InferenceFailed, match=message):
            await pool.predict(kind, ROWS)

    run_with_pool(scenario)


def test_a_load_that_raises_gives_model_load_error_naming_the_key_and_the_cause() -> None:
    async def scenario(pool: ProcessPredictPool) -> None:
        with pytest.raises(ModelLoadError, match=r"'JPCP/3'.*no artifact at 'missing'"):
            await pool.load("JPCP/3", "missing")
        with pytest.raises(VersionNotFound, match="JPCP/3"):
            await pool.predict("JPCP/3", ROWS)

    run_with_pool(scenario, workers=2)


def test_unknown_keys_and_malformed_rows_are_refused_before_any_worker_is_used() -> None:
    async def scenario(pool: ProcessPredictPool) -> None:
        with pytest.raises(VersionNotFound, match="nope"):
            await pool.predict("nope", ROWS)
        await pool.load("linear", "linear")
        with pytest.raises(InvalidInput):
            await pool.predict("linear", np.zeros((0, 5)))
        await pool.unload("linear")
        with pytest.raises(VersionNotFound):
            await pool.predict("linear", ROWS)

    run_with_pool(scenario)


def test_a_worker_killed_under_a_call_gives_worker_lost_and_is_replaced() -> None:
    async def scenario(pool: ProcessPredictPool) -> None:
        await pool.load("slow", "sleep:30")
        await pool.load("pid", "pid")
        victim = await worker_pid(pool)
        call = asyncio.create_task(pool.predict("slow", ROWS))
        await asyncio.sleep(0.2)
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(WorkerLost) as lost:
            await call
        assert lost.value.retryable
        assert await worker_pid(pool) != victim
        assert pool.stats().replaced == 1

    run_with_pool(scenario)


def test_workers_ignore_sigint() -> None:
    async def scenario(pool: ProcessPredictPool) -> None:
        await pool.load("pid", "pid")
        pid = await worker_pid(pool)
        os.kill(pid, signal.SIGINT)
        await asyncio.sleep(0.1)
        assert await worker_pid(pool) == pid

    run_with_pool(scenario)


def test_close_fails_every_pending_call_and_leaves_no_process_behind() -> None:
    outcomes: list[BaseException | None] = []

    async def scenario(pool: ProcessPredictPool) -> None:
        await pool.load("slow", "sleep:30")
        children = child_processes()
        assert len(children) == 2  # one worker and the warm spare
        calls = [asyncio.create_task(pool.predict("slow", ROWS)) for _ in range(3)]  # one runs, two wait
        await asyncio.sleep(0.1)
        await pool.close()
        results = await asyncio.gather(*calls, return_exceptions=True)
        outcomes.extend(r if isinstance(r, BaseException) else None for r in results)
        assert pool.stats().in_flight == 0
        with pytest.raises(PipelineUnavailable):
            await pool.predict("slow", ROWS)
        assert not any(child.is_running() and child.status() != psutil.STATUS_ZOMBIE for child in children)

    run_with_pool(scenario)
    assert len(outcomes) == 3
    assert all(isinstance(outcome, PipelineUnavailable) for outcome in outcomes)


def test_loads_a_close_drops_are_not_logged_as_failures(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(pool: ProcessPredictPool) -> None:
        await pool.load("m", "slow-load:2")  # the worker and the warm spare both load it
        first = {child.pid for child in child_processes()}
        os.kill(await worker_pid_of(pool), signal.SIGKILL)  # the spare takes over; a new spare starts, loading "m"
        assert await new_child(first), "no new spare was started"

    with caplog.at_level("WARNING", logger="examlops.serving"):
        run_with_pool(scenario)  # closes while the new spare's start and load are still running
    assert [r.getMessage() for r in caplog.records if "could not" in r.getMessage()] == []


async def new_child(before: set[int], within: float = 10.0) -> bool:
    """Whether a worker not in ``before`` is running within ``within`` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if {child.pid for child in child_processes()} - before:
            return True
        await asyncio.sleep(0.05)
    return False


async def worker_pid_of(pool: ProcessPredictPool) -> int:
    await pool.load("pid", "pid")
    return await worker_pid(pool)


def test_a_worker_exits_when_its_parent_is_gone_or_closes_the_pipe() -> None:
    ctx = multiprocessing.get_context("spawn")
    exits = []
    for parent_pid, close_pipe in ((-1, False), (os.getpid(), True)):
        parent_end, child_end = ctx.Pipe()
        process = ctx.Process(target=pool_worker.serve, args=(child_end, load_scripted, parent_pid), daemon=True)
        process.start()
        child_end.close()
        if close_pipe:
            parent_end.send((1, "ping", "", None))
            assert parent_end.recv()[:2] == (1, "ok")
            parent_end.close()
        process.join(timeout=20)
        exits.append(process.exitcode)
        if not parent_end.closed:
            parent_end.close()
        process.close()
    assert exits == [1, 0]


def test_a_warm_pool_forks_its_workers_from_a_server_that_imported_the_preload_and_never_mlflow() -> None:
    """The warm form serving uses: workers forked from a fork server (not our children, no fresh interpreter)
    that imported the preload once; they predict, time out and get replaced as spawned ones do."""
    preload = ("examlops.serving.pool_worker", "tests.integration.test_pool", "sklearn.linear_model")

    async def scenario(pool: ProcessPredictPool) -> None:
        await pool.load("pid", "pid")
        await pool.load("linear/1", "linear")
        pid = await worker_pid(pool)
        worker = psutil.Process(pid)
        assert worker.ppid() != os.getpid()  # forked by the server, not started by us
        assert "spawn_main" not in " ".join(worker.cmdline())
        np.testing.assert_allclose(await pool.predict("linear/1", ROWS), linear(ROWS))
        await pool.load("modules", "modules")
        loaded = set((await pool.predict("modules", ROWS)).tolist())
        assert loaded == {1.0}  # sklearn.linear_model was there before the worker imported anything
        await pool.load("slow", "sleep:30")
        with pytest.raises(InferenceTimeout):
            await pool.predict("slow", ROWS)
        assert await worker_pid(pool) != pid

    run_with_pool(scenario, loader=load_warm, workers=1, timeout_s=1.0, preload=preload)


class ModulesModel:
    """Predicts 1.0 when sklearn.linear_model and no mlflow are in memory, else 0.0."""

    def predict(self, rows: np.ndarray) -> Any:
        import sys

        warm = "sklearn.linear_model" in sys.modules and "mlflow" not in sys.modules
        return np.full(len(rows), 1.0 if warm else 0.0)


def load_warm(location: str) -> Any:
    return ModulesModel() if location == "modules" else load_scripted(location)


def test_a_forked_worker_exits_when_its_parent_is_gone() -> None:
    """A fork server's child sees the server as its parent: it watches the pid it was given as well."""
    ctx = multiprocessing.get_context("forkserver")
    parent_end, child_end = ctx.Pipe()
    process = ctx.Process(target=pool_worker.serve, args=(child_end, load_scripted, 2**22 + 1), daemon=True)
    process.start()
    child_end.close()
    process.join(timeout=20)
    parent_end.close()
    assert process.exitcode == 1
    process.close()
