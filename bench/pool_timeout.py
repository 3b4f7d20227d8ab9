"""Threads versus processes for the predict pool's hard limit (seed 000, step 7).

For a ThreadPoolExecutor of 4 threads under ``asyncio.wait_for`` and for
``ProcessPredictPool(workers=4)``: 4 predictions that spin the CPU for 10 s run
against a 1 s limit, then one normal prediction is sent. Reported: when the
normal prediction is answered, what is still busy, the CPU used after the
timeouts, and the per-call overhead of a small predict (32 x 385 rows, a tiny
linear model) as a median over 2,000 sequential calls.

    .venv/bin/python bench/pool_timeout.py [--calls 2000] [--hang 10] [--limit 1]

Figures only: nothing here asserts anything. The spinning model is pure Python
(it holds the GIL), the way a stuck CPU-bound predict does.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import psutil

from examlops.serving.pool import ProcessPredictPool

WORKERS = 4
ROWS = np.random.default_rng(0).normal(size=(32, 385))
WEIGHTS = np.random.default_rng(1).normal(size=385)
_spinning = 0
_spinning_lock = threading.Lock()


class TinyModel:
    def predict(self, rows: np.ndarray) -> np.ndarray:
        result: np.ndarray = rows @ WEIGHTS
        return result


class SpinModel:
    """Burns CPU in pure Python for ``seconds``: a stuck prediction."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def predict(self, rows: np.ndarray) -> np.ndarray:
        global _spinning
        with _spinning_lock:
            _spinning += 1
        try:
            end = time.monotonic() + self.seconds
            while time.monotonic() < end:
                pass
            return np.zeros(len(rows))
        finally:
            with _spinning_lock:
                _spinning -= 1


def load_bench_model(location: str) -> Any:
    """``tiny`` or ``spin:<seconds>``; top-level so that worker processes can import it."""
    return SpinModel(float(location.split(":")[1])) if location.startswith("spin:") else TinyModel()


def cpu_seconds() -> float:
    """User + system CPU of this process, its live children and its reaped children."""
    me = psutil.Process()
    own = me.cpu_times()
    total = own.user + own.system + own.children_user + own.children_system
    for child in me.children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


async def median_call_us(call: Callable[[], Awaitable[Any]], calls: int) -> float:
    for _ in range(50):
        await call()
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e6


async def scenario(
    hang: Callable[[], Awaitable[Any]],
    normal: Callable[[], Awaitable[Any]],
    busy: Callable[[], str],
    hang_s: float,
) -> dict[str, str]:
    """4 hanging calls, then one normal call; the figures of one approach."""
    started = time.perf_counter()
    outcomes = await asyncio.gather(*(hang() for _ in range(WORKERS)), return_exceptions=True)
    timed_out = sum(isinstance(o, BaseException) for o in outcomes)
    after_timeouts = time.perf_counter()
    cpu_before = cpu_seconds()
    still_busy = busy()
    sent = time.perf_counter()
    try:
        await normal()
        outcome = f"answered after {(time.perf_counter() - sent) * 1000:.1f} ms"
    except Exception as exc:
        outcome = f"{type(exc).__name__} after {time.perf_counter() - sent:.2f} s"
    await asyncio.sleep(max(0.0, started + hang_s + 0.5 - time.perf_counter()))
    window = time.perf_counter() - after_timeouts
    return {
        "hanging calls that timed out": f"{timed_out}/{WORKERS} after {after_timeouts - started:.2f} s",
        "when the normal call is sent": still_busy,
        "normal call (same 1 s limit)": outcome,
        "CPU used after the timeouts, until the hang ends": f"{cpu_seconds() - cpu_before:.2f} s in {window:.1f} s",
    }


async def bench_threads(calls: int, hang_s: float, limit_s: float) -> dict[str, str]:
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(WORKERS, thread_name_prefix="predict")
    tiny, spin = TinyModel(), SpinModel(hang_s)

    async def call(model: Any, limit: float = limit_s) -> Any:
        return await asyncio.wait_for(loop.run_in_executor(executor, model.predict, ROWS), limit)

    median = await median_call_us(lambda: call(tiny), calls)
    figures = {"per-call median (32 x 385, tiny model)": f"{median:.0f} µs"}

    def busy() -> str:
        return f"{_spinning} of {WORKERS} threads still spinning"

    times: list[float] = []

    async def normal() -> Any:
        # The work goes on past the caller's limit: note when a thread finally ran it.
        work = loop.run_in_executor(executor, tiny.predict, ROWS)
        times.append(time.perf_counter())
        work.add_done_callback(lambda _: times.append(time.perf_counter()))
        return await asyncio.wait_for(asyncio.shield(work), limit_s)

    figures |= await scenario(lambda: call(spin), normal, busy, hang_s)
    figures["normal call's work actually done after"] = f"{times[1] - times[0]:.2f} s (queued behind the stuck threads)"
    executor.shutdown(wait=True)
    return figures


async def bench_processes(calls: int, hang_s: float, limit_s: float) -> dict[str, str]:
    pool = ProcessPredictPool(load_bench_model, workers=WORKERS, timeout_s=limit_s)
    await pool.start()
    try:
        await pool.load("tiny", "tiny")
        await pool.load("spin", f"spin:{hang_s}")
        median = await median_call_us(lambda: pool.predict("tiny", ROWS), calls)
        figures = {"per-call median (32 x 385, tiny model)": f"{median:.0f} µs"}

        stuck = {child.pid for child in psutil.Process().children()}

        def busy() -> str:
            stats = pool.stats()
            alive = {child.pid for child in psutil.Process().children() if child.status() != psutil.STATUS_ZOMBIE}
            killed = len(stuck - alive)
            return f"{killed} killed, {stats.workers - stats.busy} of {stats.workers} workers free (the spare)"

        figures |= await scenario(lambda: pool.predict("spin", ROWS), lambda: pool.predict("tiny", ROWS), busy, hang_s)
        figures["normal call's work actually done after"] = "as answered"
        return figures
    finally:
        await pool.close()


def direct_call_us(calls: int) -> float:
    model = TinyModel()
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        model.predict(ROWS)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--hang", type=float, default=10.0, help="seconds a stuck prediction spins")
    parser.add_argument("--limit", type=float, default=1.0, help="the hard limit, in seconds")
    args = parser.parse_args()
    threads = asyncio.run(bench_threads(args.calls, args.hang, args.limit))
    processes = asyncio.run(bench_processes(args.calls, args.hang, args.limit))
    direct = direct_call_us(args.calls)
    width = max(len(name) for name in threads)
    print(f"{'':{width}}  {'threads (4, wait_for)':<48}  processes (ProcessPredictPool, 4 + spare)")
    for name, value in threads.items():
        print(f"{name:{width}}  {value:<48}  {processes[name]}")
    print(f"{'the model alone, called directly':{width}}  {direct:.0f} µs")


if __name__ == "__main__":
    main()
