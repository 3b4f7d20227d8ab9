"""Predict time of one call of a model by batch size, learnt from every predict call: what admission and the
batcher's deadline rules expect a batch to take.

``CostModel.observe(model, size, ms)`` feeds a least-squares line ``ms = fixed + per_row * size`` per model
(names match case-insensitively, as the catalog's do), with exponentially decaying weights so that it
follows a change of load; ``predict_ms(model, size)`` reads the line. While the recent calls all had about
the same size (no slope to fit) the line goes through the origin and their mean; neither coefficient is
ever negative (a slope fitted below zero is flat); a model never observed takes ``prior_ms``.

Why one line per model rather than a mean per size: every call corrects the whole line. A mean per size
is only corrected by calls of that size, and one slow outlier (a first call, a stall) at a size the
batcher then avoids because of it stays for good: the batcher keeps cutting batches short and the
estimate keeps refusing (``tests/unit/serving/test_costs.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from examlops.core.messages import InferenceRequest

ALPHA = 0.1
"""Weight of the newest call in the fit: the last ten to twenty calls count."""
FLAT = 0.25
"""Below this variance of the recent sizes (in rows squared) there is no slope to fit."""


@dataclass(slots=True)
class _Fit:
    """Exponentially weighted moments of (size, ms): weight, sums of n, t, n*n and n*t."""

    w: float = 0.0
    n: float = 0.0
    t: float = 0.0
    nn: float = 0.0
    nt: float = 0.0

    def add(self, size: int, ms: float) -> None:
        keep = 1.0 - ALPHA
        self.w = keep * self.w + ALPHA
        self.n = keep * self.n + ALPHA * size
        self.t = keep * self.t + ALPHA * ms
        self.nn = keep * self.nn + ALPHA * size * size
        self.nt = keep * self.nt + ALPHA * size * ms

    def line(self) -> tuple[float, float]:
        """(fixed, per_row) of the fit: see the module docstring."""
        mean_n, mean_t = self.n / self.w, self.t / self.w
        variance = self.nn / self.w - mean_n * mean_n
        if variance > FLAT:
            slope = max(0.0, (self.nt / self.w - mean_n * mean_t) / variance)  # more rows never take less time
            fixed = mean_t - slope * mean_n
            if fixed >= 0.0:
                return fixed, slope
        return 0.0, mean_t / max(mean_n, 1.0)  # through the origin and the mean


class CostModel:
    """Predict time (ms) of one call of a model by batch size; see the module docstring."""

    def __init__(self, prior_ms: float) -> None:
        self._prior_ms = prior_ms
        self._fits: dict[str, _Fit] = {}
        self._lines: dict[str, tuple[float, float]] = {}

    def observe(self, model: str, size: int, ms: float) -> None:
        name = model.lower()
        fit = self._fits.get(name)
        if fit is None:
            fit = self._fits[name] = _Fit()
        fit.add(max(1, size), ms)
        self._lines[name] = fit.line()

    def predict_ms(self, model: str, size: int) -> float:
        """See the module docstring."""
        line = self._lines.get(model.lower())
        if line is None:
            return self._prior_ms
        fixed, per_row = line
        return fixed + per_row * max(1, size)

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
