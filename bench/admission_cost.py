"""CPU of one admission decision (``Estimator.admit``) against a real micro-batcher, by queue length.

A ``MicroBatcher`` with ``--workers`` batches of 8 JPCP calls in flight (its handler held) and ``n``
calls waiting, half with a tight deadline (0.3 s) and half with a loose one (3 s); then the median CPU time
(``time.thread_time``) of ``admit`` for a new call with a loose deadline (it goes last: the common case
when callers share one budget) and with a tight one (it jumps the queue: the EDF test scans who is behind).
Set ``PYTHONPATH`` to another checkout to measure its code with this script (its public API is the same).

    PYTHONPATH=. .venv/bin/python bench/admission_cost.py [--waiting 0 30 300] [--calls 2000]

Figures only: nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from pathlib import Path
from typing import Any

import examlops
from examlops.core.errors import Refused
from examlops.core.messages import InferenceRequest
from examlops.core.setting_sections import AdmissionSettings
from examlops.serving.admission import Estimator
from examlops.serving.batcher import MicroBatcher


def request() -> InferenceRequest:
    return InferenceRequest(model="JPCP", embedding=(0.0,), node_count=1)


def per_call_us(estimator: Estimator, due: float, now: float, calls: int) -> float:
    """Median over 5 rounds of the CPU time of one ``admit`` (a refusal counts as a decision too)."""
    rounds = []
    for _ in range(5):
        began = time.thread_time()
        for _ in range(calls):
            with contextlib.suppress(Refused):
                estimator.admit("JPCP", due, now)
        rounds.append((time.thread_time() - began) / calls * 1e6)
    return statistics.median(rounds)


async def measure(waiting: int, workers: int, calls: int) -> dict[str, Any]:
    gate = asyncio.Event()

    async def held(batch: Any) -> list[float]:
        await gate.wait()
        return [0.0] * len(batch)

    batcher: MicroBatcher[InferenceRequest, float] = MicroBatcher(
        held, max_size=8, max_wait_s=0, eager_below=workers, max_in_flight=workers
    )
    loop = asyncio.get_running_loop()
    now = loop.time()
    tasks = [asyncio.ensure_future(batcher.submit(request(), due=now + 60)) for _ in range(8 * workers)]
    await asyncio.sleep(0.01)  # the held batches are in flight
    tasks += [
        asyncio.ensure_future(batcher.submit(request(), due=now + (0.3 if i % 2 else 3.0) + i * 1e-4))
        for i in range(waiting)
    ]
    await asyncio.sleep(0.01)
    estimator = Estimator(AdmissionSettings(), batcher, workers=workers, max_size=8)
    for size in (1, 2, 4, 8):
        estimator.costs.observe("JPCP", size, 0.2 + size * 0.05)  # a fast model: nothing is refused
    figures = {
        "waiting": len(batcher.queued()),
        "loose_us": per_call_us(estimator, now + 5.0, now, calls),
        "tight_us": per_call_us(estimator, now + 0.2, now, calls),
    }
    gate.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    await batcher.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--waiting", type=int, nargs="+", default=[0, 30, 300])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    code = Path(examlops.__file__).resolve().parent.parent
    print(f"admit() CPU per call, {args.workers} batches of 8 in flight, median of 5 rounds; the code of {code}")
    print(f"{'waiting':>8} {'loose µs':>9} {'tight µs':>9}")
    for waiting in args.waiting:
        figures = asyncio.run(measure(waiting, args.workers, args.calls))
        print(f"{figures['waiting']:>8} {figures['loose_us']:>9.1f} {figures['tight_us']:>9.1f}")


if __name__ == "__main__":
    main()
