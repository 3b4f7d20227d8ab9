"""The garbage collector of a long-running server (serving, the bridge): ``quiet_collector()`` after start-up.

Start-up's garbage is collected once, then what start-up built (the imports, a loaded hot set) is frozen: no
later collection walks it (a cycle frozen while unreachable would never be freed). The youngest
generation is then collected every ``YOUNG`` net allocations of container objects instead of CPython's 700:
a request allocates hundreds of them, nearly all freed by reference counting, so at 700 the collector ran
every few requests and, with the older generations it triggers, took about 8 % of serving's throughput at
c=64 (bench/RESULTS.md). Reference cycles are still collected, a few tens of milliseconds later.
"""

from __future__ import annotations

import gc

YOUNG = 10_000
"""Serving's: against 700, +8.6 % of throughput at c=64; 5,000 and 20,000 did no better (bench/RESULTS.md)."""


def quiet_collector(young: int = YOUNG) -> None:
    """Collect once, freeze every object that survives and collect the youngest generation every ``young``
    allocations."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old)
