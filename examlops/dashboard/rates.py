"""Requests per second and p50/p99 latency by model and alias, kept by serving whether or not a page is open.

``RateHistory(registry)`` reads the cumulative ``examlops_requests`` counter and the
``examlops_request_latency_seconds`` histogram of this process on a timer (``run``, every ``interval_s``,
started by the dashboard router's lifespan) and keeps, per (model, alias), a bounded ring of the last ``keep``
points: the rate over the interval and the latency histogram of the requests that finished in it. So a page
opened at any time shows the last ``keep * interval_s`` seconds (15 min by default), not only what happened
since it opened. ``series(model)`` gives the points per alias; ``summary(model, over_s)`` merges the newest
points' histograms and interpolates the quantiles inside the bucket that holds them (Prometheus's
``histogram_quantile``). An interval with no request has no quantile (None). Never raises on missing metrics:
a registry without them gives empty series. The clock is injectable (tests move it); the timer logs and skips
a reading that fails rather than stopping. Reads never touch the registry, a page copies the rings (one
viewer: about 0.6 % of serving's CPU at 50 predictions/s, ``bench/dashboard_cpu.py``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

Key = tuple[str, str]
"""(model, alias)."""
Buckets = tuple[tuple[float, float], ...]
"""Cumulative ``(upper bound, count)`` pairs, ascending, the last at +Inf."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    at: float
    requests: dict[Key, float]
    buckets: dict[Key, Buckets]


@dataclass(frozen=True, slots=True)
class Point:
    """One interval of one (model, alias): its end, its span, the requests and the latency histogram in it."""

    at: float
    span: float
    requests: float
    window: Buckets


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


def _delta(new: Sequence[tuple[float, float]], old: Sequence[tuple[float, float]]) -> Buckets:
    before = dict(old)
    return tuple((bound, max(0.0, count - before.get(bound, 0.0))) for bound, count in new)


def _merge(windows: Iterable[Buckets]) -> Buckets:
    total: dict[float, float] = {}
    for window in windows:
        for bound, count in window:
            total[bound] = total.get(bound, 0.0) + count
    return tuple(sorted(total.items()))


class RateHistory:
    def __init__(
        self,
        registry: Any,
        *,
        interval_s: float = 5.0,
        keep: int = 180,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.interval_s = interval_s
        self.keep = keep
        self.clock = clock
        self._last: Snapshot | None = None
        self._rings: dict[Key, deque[Point]] = {}
        self._lock = threading.Lock()  # the timer samples in a worker thread while pages read

    def sample(self) -> None:
        """Read the registry and append one point per (model, alias) served since the previous reading."""
        snap = read_snapshot(self.registry, self.clock())
        with self._lock:
            old, self._last = self._last, snap
            if old is None or snap.at <= old.at:
                return
            span = snap.at - old.at
            for key, count in snap.requests.items():
                window = _delta(snap.buckets.get(key, ()), old.buckets.get(key, ()))
                point = Point(snap.at, span, max(0.0, count - old.requests.get(key, 0.0)), window)
                self._rings.setdefault(key, deque(maxlen=self.keep)).append(point)

    async def run(self, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        """Sample every ``interval_s`` until cancelled (the registry is read off the event loop)."""
        while True:
            try:
                await asyncio.to_thread(self.sample)
            except Exception:  # a collector that fails must not end the history for good
                log.exception("reading serving's metrics for the dashboard's rates failed")
            await sleep(self.interval_s)

    def _points(self, model: str) -> dict[str, list[Point]]:
        with self._lock:
            return {alias: list(ring) for (m, alias), ring in sorted(self._rings.items()) if m == model}

    def series(self, model: str) -> list[AliasSeries]:
        """Per alias of ``model`` that served anything while kept, oldest point first."""
        out = []
        for alias, points in self._points(model).items():
            out.append(
                AliasSeries(
                    alias,
                    [p.at for p in points],
                    [p.requests / p.span for p in points],
                    [_ms(quantile(0.5, p.window)) for p in points],
                    [_ms(quantile(0.99, p.window)) for p in points],
                )
            )
        return out

    def summary(self, model: str, over_s: float = 60.0) -> dict[str, dict[str, float | None]]:
        """Per alias: rps, p50 and p99 (ms) over the points that ended in the last ``over_s`` seconds of the
        newest reading (at least the newest point)."""
        out: dict[str, dict[str, float | None]] = {}
        for alias, points in self._points(model).items():
            newest = points[-1].at
            recent = [p for p in points if p.at > newest - over_s] or points[-1:]
            window = _merge(p.window for p in recent)
            out[alias] = {
                "rps": sum(p.requests for p in recent) / sum(p.span for p in recent),
                "p50_ms": _ms(quantile(0.5, window)),
                "p99_ms": _ms(quantile(0.99, window)),
            }
        return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def chart_data(series: Iterable[AliasSeries]) -> dict[str, Any]:
    """The JSON a page's charts read: one time axis (``at``, UNIX seconds) shared by every alias, and per alias
    its rps, p50 and p99 on that axis, None where the alias has no point (it started serving later, or its
    ring dropped older points): an alias that starts late is drawn where it started, not from the axis's start."""
    listed = list(series)
    axis = sorted({at for s in listed for at in s.at})
    aliases: dict[str, dict[str, list[Any]]] = {}
    for s in listed:
        index = {at: i for i, at in enumerate(s.at)}
        aliases[s.alias] = {
            name: [values[index[at]] if at in index else None for at in axis]
            for name, values in (("rps", s.rps), ("p50_ms", s.p50_ms), ("p99_ms", s.p99_ms))
        }
    return {"at": axis, "aliases": aliases}
