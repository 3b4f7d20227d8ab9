"""Requests per second and latency quantiles kept by serving on a timer, with a clock the test moves."""

from __future__ import annotations

import asyncio
import contextlib

from prometheus_client import CollectorRegistry, Counter, Histogram

from examlops.dashboard.rates import RateHistory, chart_data, quantile
from examlops.serving.metrics import LATENCY_BUCKETS


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def metrics(registry: CollectorRegistry) -> tuple[Counter, Histogram]:
    requests = Counter("examlops_requests", "", ["model", "alias", "outcome"], registry=registry)
    latency = Histogram(
        "examlops_request_latency_seconds", "", ["model", "alias"], buckets=LATENCY_BUCKETS, registry=registry
    )
    return requests, latency


def test_rate_and_quantiles_are_those_of_the_requests_between_two_readings() -> None:
    registry, clock = CollectorRegistry(), Clock()
    requests, latency = metrics(registry)
    history = RateHistory(registry, clock=clock)
    history.sample()
    for _ in range(98):
        requests.labels("JPCP", "Production", "ok").inc()
        latency.labels("JPCP", "Production").observe(0.004)
    for _ in range(2):
        requests.labels("JPCP", "Production", "failed").inc()
        latency.labels("JPCP", "Production").observe(0.2)
    clock.now += 10
    history.sample()
    [series] = history.series("JPCP")
    assert series.alias == "Production" and series.rps == [10.0]
    assert series.p50_ms[0] is not None and 2.5 < series.p50_ms[0] <= 5.0
    assert series.p99_ms[0] is not None and 100.0 < series.p99_ms[0] <= 250.0
    assert history.summary("JPCP")["Production"]["rps"] == 10.0
    assert chart_data(history.series("JPCP"))["at"] == [1010.0]


def test_aliases_that_start_at_different_times_share_one_time_axis_with_gaps() -> None:
    registry, clock = CollectorRegistry(), Clock()
    requests, latency = metrics(registry)
    history = RateHistory(registry, clock=clock)
    history.sample()
    for step in range(4):  # Production serves from the start, Canary from the third interval on
        for _ in range(10):
            requests.labels("JPCP", "Production", "ok").inc()
            latency.labels("JPCP", "Production").observe(0.004)
        if step >= 2:
            for _ in range(5):
                requests.labels("JPCP", "Canary", "ok").inc()
                latency.labels("JPCP", "Canary").observe(0.004)
        clock.now += 5
        history.sample()
    data = chart_data(history.series("JPCP"))
    assert data["at"] == [1005.0, 1010.0, 1015.0, 1020.0]
    assert data["aliases"]["Production"]["rps"] == [2.0, 2.0, 2.0, 2.0]
    assert data["aliases"]["Canary"]["rps"] == [None, None, 1.0, 1.0]
    canary_p50 = data["aliases"]["Canary"]["p50_ms"]
    assert canary_p50[:2] == [None, None] and all(v is not None for v in canary_p50[2:])


def test_an_interval_without_requests_has_a_zero_rate_and_no_quantile() -> None:
    registry, clock = CollectorRegistry(), Clock()
    requests, latency = metrics(registry)
    requests.labels("AC", "Canary", "ok").inc()
    latency.labels("AC", "Canary").observe(0.01)
    history = RateHistory(registry, clock=clock)
    history.sample()
    clock.now += 5
    history.sample()
    [series] = history.series("AC")
    assert series.rps == [0.0] and series.p50_ms == [None] and series.p99_ms == [None]


def test_each_ring_keeps_its_newest_points_only() -> None:
    registry, clock = CollectorRegistry(), Clock()
    requests, _ = metrics(registry)
    history = RateHistory(registry, keep=12, clock=clock)
    history.sample()
    for step in range(40):
        requests.labels("JPCP", "Production", "ok").inc(step)
        requests.labels("JPCP", "Canary", "ok").inc()
        clock.now += 5
        history.sample()
    production, canary = {s.alias: s for s in history.series("JPCP")}["Production"], history.series("JPCP")[0]
    assert len(production.at) == 12 and production.at[-1] == clock.now and production.at[0] == clock.now - 55
    assert production.rps[-1] == 39 / 5 and canary.alias == "Canary" and len(canary.rps) == 12


def test_the_summary_merges_the_last_minute_of_points() -> None:
    registry, clock = CollectorRegistry(), Clock()
    requests, latency = metrics(registry)
    history = RateHistory(registry, clock=clock)
    history.sample()
    for step in range(24):  # two minutes: 5 requests a reading for the first, 1 for the second
        for _ in range(5 if step < 12 else 1):
            requests.labels("JPCP", "Production", "ok").inc()
            latency.labels("JPCP", "Production").observe(0.004 if step < 12 else 0.2)
        clock.now += 5
        history.sample()
    minute = history.summary("JPCP", over_s=60.0)["Production"]
    assert minute["rps"] == 12 / 60
    assert minute["p50_ms"] is not None and minute["p50_ms"] > 100.0


def test_the_history_is_kept_while_nobody_reads_it() -> None:
    """The timer samples on its own: a reader arriving later sees the points taken before it came."""
    registry, clock = CollectorRegistry(), Clock()
    requests, _ = metrics(registry)
    history = RateHistory(registry, interval_s=5.0, clock=clock)
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        requests.labels("JPCP", "Production", "ok").inc(10)
        clock.now += seconds
        if len(sleeps) == 6:
            raise asyncio.CancelledError

    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(history.run(sleep))
    [series] = history.series("JPCP")
    assert sleeps == [5.0] * 6 and series.rps == [2.0] * 5


def test_a_registry_without_the_metrics_gives_empty_series() -> None:
    history = RateHistory(CollectorRegistry(), clock=Clock())
    history.sample()
    assert history.series("JPCP") == [] and history.summary("JPCP") == {}


def test_quantile_interpolates_within_its_bucket_and_is_none_when_empty() -> None:
    assert quantile(0.5, [(1.0, 0.0), (2.0, 10.0), (float("inf"), 10.0)]) == 1.5
    assert quantile(0.5, [(1.0, 0.0), (float("inf"), 0.0)]) is None
    assert quantile(0.99, [(1.0, 0.0), (float("inf"), 4.0)]) == 1.0
