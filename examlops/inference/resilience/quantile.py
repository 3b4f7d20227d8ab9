"""A quantile of the last N observations, exact over its window, so it follows a route whose latency drifts.

``add`` is O(N) (one sorted insert and one sorted delete over at most ``size`` floats, a few microseconds at
N = 256); ``quantile`` is O(1). Nearest-rank definition: the smallest observation with at least ``q`` of
the window at or below it. An empty window has no quantile (``None``), never a made-up one.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque


class SlidingQuantile:
    """Quantiles of the most recent ``size`` observations."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("a sliding window holds at least one observation")
        self._size = size
        self._arrival: deque[float] = deque()
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._sorted)

    def add(self, value: float) -> None:
        if len(self._arrival) == self._size:
            oldest = self._arrival.popleft()
            del self._sorted[bisect_left(self._sorted, oldest)]
        self._arrival.append(value)
        insort(self._sorted, value)

    def quantile(self, q: float) -> float | None:
        """The nearest-rank ``q`` quantile (0 < q <= 1) of the window, or None while it is empty."""
        if not 0 < q <= 1:
            raise ValueError("a quantile lies in (0, 1]")
        if not self._sorted:
            return None
        rank = max(1, math.ceil(q * len(self._sorted)))
        return self._sorted[rank - 1]
