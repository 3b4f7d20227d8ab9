"""Predict time of one call of a model by batch size, learnt from every predict call: what admission and the
batcher's deadline rules expect a batch to take.

``CostModel.observe(model, size, ms)`` keeps an exponentially weighted mean per model and exact batch size
(names match case-insensitively, as the catalog's do). ``predict_ms(model, size)`` is that mean; a size
never observed is interpolated linearly between the nearest observed sizes around it, scaled from the
largest observed below it (a row costs what a row of that batch cost), or, below every observed size, the
smallest one's mean (a smaller batch takes no longer); a model never observed takes ``prior_ms``.

Why exact sizes: a batch's time grows with its rows, and a mean shared by sizes as far apart as 16 and 31
was off by a third, enough for the batcher to let a batch run past a tight deadline
(``tests/unit/serving/test_overload.py``).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence

from examlops.core.messages import InferenceRequest

ALPHA = 0.2
"""Weight of the newest observation in a size's mean: recent enough to follow a load change."""


class CostModel:
    """Predict time (ms) of one call of a model by batch size; see the module docstring."""

    def __init__(self, prior_ms: float) -> None:
        self._prior_ms = prior_ms
        self._mean: dict[str, dict[int, float]] = {}
        self._sizes: dict[str, list[int]] = {}  # the observed sizes of each model, sorted

    def observe(self, model: str, size: int, ms: float) -> None:
        name = model.lower()
        means = self._mean.setdefault(name, {})
        old = means.get(size)
        if old is None:
            bisect.insort(self._sizes.setdefault(name, []), size)
            means[size] = ms
        else:
            means[size] = old + ALPHA * (ms - old)

    def predict_ms(self, model: str, size: int) -> float:
        """See the module docstring."""
        name = model.lower()
        means = self._mean.get(name)
        if not means:
            return self._prior_ms
        found = means.get(size)
        if found is not None:
            return found
        sizes = self._sizes[name]
        at = bisect.bisect_left(sizes, size)
        if at == 0:
            return means[sizes[0]]
        below = sizes[at - 1]
        if at == len(sizes):
            return means[below] * size / below
        above = sizes[at]
        return means[below] + (means[above] - means[below]) * (size - below) / (above - below)

    def work_ms(self, counts: Iterable[tuple[str, int]], max_size: int) -> float:
        """Predict time of ``counts`` (model, calls) in batches of at most ``max_size`` calls per model."""
        total = 0.0
        for model, count in counts:
            full, rest = divmod(count, max_size)
            total += full * self.predict_ms(model, max_size) + (self.predict_ms(model, rest) if rest else 0.0)
        return total

    def lead_ms(self, batch: Sequence[InferenceRequest]) -> float:
        """Time to handle ``batch``: its models' groups are predicted side by side, so the slowest one."""
        counts = Counter(request.model.lower() for request in batch)
        return max((self.predict_ms(model, count) for model, count in counts.items()), default=0.0)
