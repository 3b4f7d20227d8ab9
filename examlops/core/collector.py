"""The garbage collector of a long-running server (serving, the bridge): ``quiet_collector()`` after start-up,
and ``PauseMeter``, which times its pauses for the server's metrics.

Start-up's garbage is collected once, then what start-up built (the imports, a loaded hot set) is frozen: no
later collection walks it (a cycle frozen while unreachable would never be freed). The youngest
generation is then collected every ``YOUNG`` net allocations of container objects instead of CPython's 700:
a request allocates hundreds of them, nearly all freed by reference counting, so at 700 the collector ran
every few requests and, with the older generations it triggers, took about 8 % of serving's throughput at
c=64 (bench/RESULTS.md). Reference cycles are still collected, a few tens of milliseconds later.

A collection stops every thread of the process, the event loop's with it: every call waiting for the loop
then waits for the collection too. ``PauseMeter`` makes those pauses visible (``examlops_gc_pause_seconds``,
by generation); under overload, with a thousand calls queued, one of the middle generation took 45-87 ms
(bench/RESULTS.md).
"""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

YOUNG = 10_000
"""Serving's: against 700, +8.6 % of throughput at c=64; 5,000 and 20,000 did no better (bench/RESULTS.md)."""


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
