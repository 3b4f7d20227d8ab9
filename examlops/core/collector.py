"""The garbage collector of a long-running server (serving, the bridge): ``quiet_collector()`` after start-up,
``PauseMeter``, which times its pauses for the server's metrics, and ``LoadGovernor``, which holds
automatic collection off while many calls are in flight.

Start-up's garbage is collected once, then what start-up built (the imports, a loaded hot set) is frozen: no
later collection walks it (a cycle frozen while unreachable would never be freed). The youngest
generation is then collected every ``YOUNG`` net allocations of container objects instead of CPython's 700:
a request allocates hundreds of them, nearly all freed by reference counting, so at 700 the collector ran
every few requests, a cost measured at c=64 (bench/RESULTS.md). Reference cycles are still collected, a few
tens of milliseconds later.

A collection stops every thread of the process, the event loop's with it: every call waiting for the loop
then waits for the collection too. ``PauseMeter`` makes those pauses visible (``examlops_gc_pause_seconds``,
by generation).

Those pauses grow with the calls in flight: each waiting call holds its ASGI stack's coroutines and
closures, its request and its trace, all alive, so a collection under a deep queue walks them and frees
next to nothing (bench/RESULTS.md, issue 17's collector section). ``LoadGovernor`` switches automatic
collection off while at least ``pause_at`` calls are in flight and on again once fewer than half as many
are. What it moves rather than removes:

- While it holds, the young generation's count of net allocations (``gc.get_count()[0]``) still grows with
  the calls that arrive and the garbage cycles that calls leave; each time it reaches ``cap`` the governor
  collects the young generation once: a pause as long as that generation is big, after which the
  survivors, calls still waiting among them, sit in the middle generation.
- Cycles left in the middle generation (by calls that outlived a collection at the cap) are collected only
  after the hold, by the first middle-generation collection.
- The first automatic collection after the hold walks the young generation as it is then: everything
  allocated since the last collection and still there.

Memory held by cycles under a hold therefore grows by about ``cap`` net allocations of container objects
between collections at the cap (the count is read every ``poll_s``, so it may pass ``cap`` by what one
poll's interval allocates), plus what the middle generation gathers until the hold ends. Serving's calls
leave no cycles of their own when they fail or are refused (``serving.batcher``, ``serving.pipeline``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

log = logging.getLogger(__name__)

YOUNG = 10_000
"""Serving's young threshold: faster at c=64 than 700, and than 5,000 or 20,000 (bench/RESULTS.md)."""


def quiet_collector(young: int = YOUNG) -> None:
    """Collect once, freeze every object that survives and collect the youngest generation every ``young``
    allocations."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old)


PAUSE_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
"""From a young collection of a quiet server (under a millisecond) to a full one under a deep queue."""


class PauseMeter:
    """Times every collection of the process (``gc.callbacks``), whichever thread runs it, into
    ``examlops_gc_pause_seconds`` on ``registry``, labelled by the generation collected (0 youngest, 2 all).
    ``start`` and ``stop`` add and remove the callback (each idempotent); the histogram stays with its
    registry. A second meter on the same registry raises prometheus_client's duplicate-timeseries
    ``ValueError``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        histogram = Histogram(
            "examlops_gc_pause_seconds",
            "Garbage collector pauses (every thread of the process waits), by generation collected",
            ["generation"],
            buckets=PAUSE_BUCKETS_S,
            registry=registry,
        )
        self._by_generation = [histogram.labels(str(generation)) for generation in range(3)]
        self._began = 0.0

    def start(self) -> None:
        if self._timed not in gc.callbacks:
            gc.callbacks.append(self._timed)

    def stop(self) -> None:
        with contextlib.suppress(ValueError):  # not started, or stopped already
            gc.callbacks.remove(self._timed)

    def _timed(self, phase: str, info: dict[str, Any]) -> None:
        # CPython runs one collection at a time in the process, so a start and its stop pair up even though the
        # GIL may change hands inside a callback. The label children are made once, in __init__: the callback
        # must not call labels(), whose lock the thread that triggered the collection may hold.
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began:
            self._by_generation[info["generation"]].observe(time.perf_counter() - self._began)
            self._began = 0.0


class LoadGovernor:
    """Automatic collection off while ``in_flight()`` is at least ``pause_at``, on again once it is below
    ``pause_at // 2`` (at least 1); while it is off, the young generation is collected each time it has grown
    by ``cap`` net allocations (module docstring). ``in_flight`` is read every ``poll_s`` on the event loop
    that called ``start``. On ``registry``: ``examlops_gc_deferred``, 1 while collection is held off, and
    ``examlops_gc_held_collections_total``, the young collections made at the cap.

    The governor only undoes what it did: collection that was off already when it looked is left off, and
    collection someone else switched on again ends its hold (until the next look finds the load still high;
    a switch off and on again between two looks goes unseen). However its task ends (``close``, a cancel, an
    ``in_flight`` that raises, which is logged), collection is on again; ``start`` after ``close`` does
    nothing."""

    def __init__(
        self,
        in_flight: Callable[[], int],
        registry: CollectorRegistry,
        *,
        pause_at: int,
        cap: int = 500_000,
        poll_s: float = 0.05,
    ) -> None:
        if pause_at < 1 or cap < 1 or poll_s <= 0:
            raise ValueError("pause_at and cap must be >= 1 and poll_s > 0")
        self._in_flight = in_flight
        self._pause_at, self._resume_below = pause_at, max(1, pause_at // 2)
        self._cap, self._poll_s = cap, poll_s
        self._deferred = Gauge(
            "examlops_gc_deferred",
            "1 while automatic garbage collection is held off because many calls are in flight",
            registry=registry,
        )
        self._at_cap = Counter(
            "examlops_gc_held_collections",
            "Young collections made while automatic collection was held off (each time it grew by the cap)",
            registry=registry,
        )
        self._holding = self._closed = False
        self._task: asyncio.Task[None] | None = None

    @property
    def holding(self) -> bool:
        """Collection is off because this governor switched it off."""
        return self._holding

    def start(self) -> None:
        """Start looking at the load on the running loop; idempotent, and nothing once closed."""
        if not self._closed and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run(), name="gc-governor")

    async def close(self) -> None:
        """Stop looking and switch collection on again if this governor held it off."""
        self._closed = True
        task, self._task = self._task, None
        try:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        finally:
            self._let_go()

    def step(self) -> None:
        """One look at the load: hold collection off, or let it run again (what ``start``'s task does)."""
        calls = self._in_flight()
        if self._holding:
            if gc.isenabled():  # someone else switched it on: the hold is over
                self._holding = False
                self._deferred.set(0)
            elif calls < self._resume_below:
                self._let_go()
            elif gc.get_count()[0] >= self._cap:
                gc.collect(0)  # the cycles made and left in the young generation since; held off again
                self._at_cap.inc()
        elif calls >= self._pause_at and gc.isenabled():
            gc.disable()
            self._holding = True
            self._deferred.set(1)

    async def _run(self) -> None:
        try:
            while True:
                self.step()
                await asyncio.sleep(self._poll_s)
        except Exception:
            log.exception("the garbage collector's governor stopped; automatic collection is on")
        finally:
            self._let_go()

    def _let_go(self) -> None:
        """End this governor's hold, if it holds: collection on again."""
        if self._holding:
            self._holding = False
            self._deferred.set(0)
            gc.enable()
