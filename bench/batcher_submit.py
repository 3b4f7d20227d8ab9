"""CPU per submit to the micro-batcher while every batch slot is taken and ``--waiting`` items wait.

The batcher (``serving.batcher.MicroBatcher``, max_in_flight=1, eager_below=1, max_size=32) is held full
by a gated handler; the queue is filled with ``--waiting`` items, then ``--submits`` more are submitted
one at a time, each followed by the loop turns its wake-up takes. Printed: the median over ``--rounds``
of the main thread's CPU time per submit, for each queue length, ungrouped (the uvicorn engine) and
grouped by ``--groups`` models (the Ray engine; every group full), less the same loop turns without a
submit. Runs the ``examlops`` on ``PYTHONPATH``: point it at another checkout for a before/after.

    PYTHONPATH=. .venv/bin/python bench/batcher_submit.py [--waiting 200 2000] [--submits 500] [--rounds 5]

Figures only: nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence
from typing import Any

from examlops.serving.batcher import MicroBatcher

TURNS = 4  # loop turns a submit and the batcher's wake-up take


async def turns() -> None:
    for _ in range(TURNS):
        await asyncio.sleep(0)


async def one_round(waiting: int, submits: int, groups: int) -> float | None:
    """CPU µs per submit with ``waiting`` items queued behind full slots (``groups`` 0: ungrouped)."""
    gate = asyncio.Event()

    async def handler(items: Sequence[int]) -> list[int | BaseException]:
        await gate.wait()
        return list(items)

    options: dict[str, Any] = {"group": (lambda item: item % groups)} if groups else {}
    try:
        batcher: MicroBatcher[int, int] = MicroBatcher(
            handler, max_size=32, max_wait_s=0.05, eager_below=1, max_in_flight=1, **options
        )
    except TypeError:
        return None  # a checkout without grouping
    loop = asyncio.get_running_loop()
    due = loop.time() + 3600
    tasks = [loop.create_task(batcher.submit(k, due=due)) for k in range(max(groups, 1))]
    await turns()  # one batch per group is handed over: every slot is taken
    tasks += [loop.create_task(batcher.submit(k, due=due)) for k in range(waiting)]
    await turns()
    idle = time.thread_time()
    for _ in range(submits):
        await turns()
    idle = time.thread_time() - idle
    start = time.thread_time()
    for k in range(submits):
        tasks.append(loop.create_task(batcher.submit(k, due=due)))
        await turns()
    spent = time.thread_time() - start - idle
    await batcher.close()
    await asyncio.gather(*tasks, return_exceptions=True)
    return spent / submits * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waiting", type=int, nargs="+", default=[200, 2000])
    parser.add_argument("--submits", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--groups", type=int, default=4, help="models in the grouped runs")
    args = parser.parse_args()
    for waiting in args.waiting:
        for label, groups in (("ungrouped", 0), (f"grouped by {args.groups}", args.groups)):
            figures = [asyncio.run(one_round(waiting, args.submits, groups)) for _ in range(args.rounds)]
            if None in figures:
                print(f"waiting {waiting:5d}  {label:>14}: not in this checkout")
                continue
            median = statistics.median(f for f in figures if f is not None)
            print(f"waiting {waiting:5d}  {label:>14}: {median:8.1f} µs CPU per submit", flush=True)


if __name__ == "__main__":
    main()
