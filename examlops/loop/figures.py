"""What one version did in a canary window: calls, model failures, late refusals, latency percentiles.

``CallSample`` is one traced call as the analysis needs it; ``figures_of(samples, version)`` sums the
samples of one version into ``VersionFigures``. A model failure is a call whose error code names a
``model_failure`` error (the model raised, timed out or returned nothing: what the retrain trigger counts);
a late refusal is a call refused after routing because its budget ran out while queued. Latency
percentiles are over answered calls only; None when a version answered none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from examlops.core.errors import error_class


@dataclass(frozen=True, slots=True)
class CallSample:
    """One traced call: the version that served it, its outcome (answered, refused, failed), error code,
    time used (ms) and when it arrived (UNIX seconds)."""

    version: str | None
    outcome: str
    error_code: str
    used_ms: float
    at: float


@dataclass(frozen=True, slots=True)
class VersionFigures:
    version: str
    requests: int
    answered: int
    model_failures: int
    late_refusals: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None

    @property
    def failure_rate(self) -> float:
        return self.model_failures / self.requests if self.requests else 0.0

    @property
    def refusal_rate(self) -> float:
        return self.late_refusals / self.requests if self.requests else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "failure_rate": round(self.failure_rate, 4),
            "refusal_rate": round(self.refusal_rate, 4),
        }


def is_model_failure(error_code: str) -> bool:
    """Whether a trace's error code names a failure of the model itself (``model_failure`` errors)."""
    kind = error_class(error_code)
    return kind is not None and kind.model_failure


def figures_of(samples: Iterable[CallSample], version: str) -> VersionFigures:
    """The figures of the calls ``version`` served among ``samples``."""
    requests = answered = failures = late = 0
    latencies: list[float] = []
    for sample in samples:
        if sample.version != version:
            continue
        requests += 1
        if sample.outcome == "answered":
            answered += 1
            latencies.append(sample.used_ms)
        elif is_model_failure(sample.error_code):
            failures += 1
        elif sample.error_code == "refused":
            late += 1
    p50 = p95 = p99 = None
    if latencies:
        p50, p95, p99 = (float(v) for v in np.percentile(np.asarray(latencies, dtype=np.float64), [50, 95, 99]))
    return VersionFigures(version, requests, answered, failures, late, p50, p95, p99)
