"""Requests per second and p50/p99 latency by model and alias, from serving's own Prometheus metrics.

``RateSampler(registry)`` reads the cumulative ``examlops_requests`` counter and the
``examlops_request_latency_seconds`` histogram of this process and keeps one snapshot per ``min_interval_s``
(taken when a page asks, so the sampler costs nothing while nobody looks) for ``keep_s``. ``series(model)``
gives, per alias, one point per pair of neighbouring snapshots: the rate over that interval and the
quantiles of the requests that finished in it, interpolated inside the histogram bucket that holds them
(Prometheus's ``histogram_quantile``). An interval with no request has no quantile (None). Never raises on
missing metrics: a registry without them gives empty series.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

Key = tuple[str, str]
"""(model, alias)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    at: float
    requests: dict[Key, float]
    buckets: dict[Key, tuple[tuple[float, float], ...]]
    """Cumulative ``(upper bound, count)`` pairs, ascending, the last at +Inf."""


@dataclass(frozen=True, slots=True)
class AliasSeries:
    alias: str
    at: list[float]
    rps: list[float]
    p50_ms: list[float | None]
    p99_ms: list[float | None]


def read_snapshot(registry: Any, now: float) -> Snapshot:
    """One reading of the two metrics in ``registry`` (a ``prometheus_client.CollectorRegistry``)."""
    requests: dict[Key, float] = {}
    buckets: dict[Key, list[tuple[float, float]]] = {}
    for family in registry.collect():
        if family.name == "examlops_requests":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    key = (sample.labels["model"], sample.labels["alias"])
                    requests[key] = requests.get(key, 0.0) + sample.value
        elif family.name == "examlops_request_latency_seconds":
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    key = (sample.labels["model"], sample.labels["alias"])
                    buckets.setdefault(key, []).append((float(sample.labels["le"]), sample.value))
    return Snapshot(now, requests, {key: tuple(sorted(pairs)) for key, pairs in buckets.items()})


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of a (differenced) cumulative histogram, in the histogram's unit; None if empty."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound  # beyond the last finite bucket: its bound is the best we can say
            span = count - lower_count
            return lower_bound + (bound - lower_bound) * ((rank - lower_count) / span if span else 1.0)
        lower_bound, lower_count = bound, count
    return lower_bound


def _delta(new: Sequence[tuple[float, float]], old: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    before = dict(old)
    return [(bound, max(0.0, count - before.get(bound, 0.0))) for bound, count in new]


class RateSampler:
    def __init__(
        self,
        registry: Any,
        *,
        min_interval_s: float = 2.0,
        keep_s: float = 900.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.min_interval_s = min_interval_s
        self.keep_s = keep_s
        self.clock = clock
        self._snapshots: deque[Snapshot] = deque()
        self._lock = threading.Lock()  # pages sample from worker threads

    def sample(self) -> None:
        """Take a snapshot unless the last one is younger than ``min_interval_s``; drop those past ``keep_s``."""
        with self._lock:
            now = self.clock()
            if self._snapshots and now - self._snapshots[-1].at < self.min_interval_s:
                return
            self._snapshots.append(read_snapshot(self.registry, now))
            while self._snapshots and self._snapshots[0].at < now - self.keep_s:
                self._snapshots.popleft()

    def series(self, model: str) -> list[AliasSeries]:
        """Per alias of ``model`` that served anything since the first snapshot kept, oldest point first."""
        snaps = list(self._snapshots)
        aliases = sorted({alias for snap in snaps for (m, alias) in snap.requests if m == model})
        out = []
        for alias in aliases:
            key = (model, alias)
            at: list[float] = []
            rps: list[float] = []
            p50: list[float | None] = []
            p99: list[float | None] = []
            for old, new in itertools.pairwise(snaps):
                span = new.at - old.at
                if span <= 0:
                    continue
                at.append(new.at)
                rps.append(max(0.0, new.requests.get(key, 0.0) - old.requests.get(key, 0.0)) / span)
                window = _delta(new.buckets.get(key, ()), old.buckets.get(key, ()))
                p50.append(_ms(quantile(0.5, window)))
                p99.append(_ms(quantile(0.99, window)))
            out.append(AliasSeries(alias, at, rps, p50, p99))
        return out

    def summary(self, model: str, over_s: float = 60.0) -> dict[str, dict[str, float | None]]:
        """Per alias: rps, p50 and p99 (ms) over the last ``over_s`` seconds kept (or as much as is kept)."""
        snaps = list(self._snapshots)
        if len(snaps) < 2:
            return {}
        new = snaps[-1]
        old = next((s for s in snaps if s.at >= new.at - over_s), snaps[0])
        if old is new:
            old = snaps[-2]
        span = new.at - old.at
        out: dict[str, dict[str, float | None]] = {}
        for m, alias in sorted(new.requests):
            if m != model:
                continue
            key = (m, alias)
            window = _delta(new.buckets.get(key, ()), old.buckets.get(key, ()))
            out[alias] = {
                "rps": max(0.0, new.requests[key] - old.requests.get(key, 0.0)) / span,
                "p50_ms": _ms(quantile(0.5, window)),
                "p99_ms": _ms(quantile(0.99, window)),
            }
        return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def chart_data(series: Iterable[AliasSeries]) -> dict[str, Any]:
    """The JSON a page's charts read: one x axis per alias (UNIX seconds) with its rps, p50 and p99."""
    return {s.alias: {"at": s.at, "rps": s.rps, "p50_ms": s.p50_ms, "p99_ms": s.p99_ms} for s in series}
