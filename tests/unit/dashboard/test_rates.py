"""Requests per second and latency quantiles from serving's own metrics, with a clock the test moves."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from examlops.dashboard.rates import RateSampler, chart_data, quantile
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


def test_rate_and_quantiles_are_those_of_the_requests_between_two_snapshots() -> None:
    registry, clock = CollectorRegistry(), Clock()
    requests, latency = metrics(registry)
    sampler = RateSampler(registry, clock=clock)
    sampler.sample()
    for _ in range(98):
        requests.labels("JPCP", "Production", "ok").inc()
        latency.labels("JPCP", "Production").observe(0.004)
    for _ in range(2):
        requests.labels("JPCP", "Production", "failed").inc()
        latency.labels("JPCP", "Production").observe(0.2)
    clock.now += 10
    sampler.sample()
    [series] = sampler.series("JPCP")
    assert series.alias == "Production" and series.rps == [10.0]
    assert series.p50_ms[0] is not None and 2.5 < series.p50_ms[0] <= 5.0
    assert series.p99_ms[0] is not None and 100.0 < series.p99_ms[0] <= 250.0
    assert sampler.summary("JPCP")["Production"]["rps"] == 10.0
    assert chart_data(sampler.series("JPCP"))["Production"]["at"] == [1010.0]


def test_an_interval_without_requests_has_a_zero_rate_and_no_quantile() -> None:
    registry, clock = CollectorRegistry(), Clock()
    requests, latency = metrics(registry)
    requests.labels("AC", "Canary", "ok").inc()
    latency.labels("AC", "Canary").observe(0.01)
    sampler = RateSampler(registry, clock=clock)
    sampler.sample()
    clock.now += 5
    sampler.sample()
    [series] = sampler.series("AC")
    assert series.rps == [0.0] and series.p50_ms == [None] and series.p99_ms == [None]


def test_snapshots_closer_than_the_interval_are_not_taken_and_old_ones_are_dropped() -> None:
    registry, clock = CollectorRegistry(), Clock()
    metrics(registry)
    sampler = RateSampler(registry, min_interval_s=2.0, keep_s=60.0, clock=clock)
    sampler.sample()
    clock.now += 1
    sampler.sample()
    assert len(sampler._snapshots) == 1
    for _ in range(40):
        clock.now += 3
        sampler.sample()
    assert all(s.at >= clock.now - 60.0 for s in sampler._snapshots)


def test_a_registry_without_the_metrics_gives_empty_series() -> None:
    sampler = RateSampler(CollectorRegistry(), clock=Clock())
    sampler.sample()
    assert sampler.series("JPCP") == [] and sampler.summary("JPCP") == {}


def test_quantile_interpolates_within_its_bucket_and_is_none_when_empty() -> None:
    assert quantile(0.5, [(1.0, 0.0), (2.0, 10.0), (float("inf"), 10.0)]) == 1.5
    assert quantile(0.5, [(1.0, 0.0), (float("inf"), 0.0)]) is None
    assert quantile(0.99, [(1.0, 0.0), (float("inf"), 4.0)]) == 1.0
