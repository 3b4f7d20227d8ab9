"""The pipeline's Prometheus metrics: requests by model, alias and outcome; latency; batch sizes; the hot set.

Label values stay bounded: an unknown model is labelled ``unknown`` and an alias nobody serves ``other``
(the pipeline decides the labels; this module only declares the metrics).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from examlops.core.errors import (
    DeadlineExceeded,
    DependencyUnavailable,
    InferenceTimeout,
    InvalidInput,
    ModelLoadError,
    NotFound,
    NotReady,
    Refused,
)
from examlops.serving.hotset import HotSet

PINNED_ALIAS = "pinned"
ERROR_BUCKETS_MS = (-100, -50, -20, -10, -5, -2, 0, 2, 5, 10, 20, 50, 100, 250)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def outcome_of(exc: BaseException) -> str:
    """The ``outcome`` label of a failed request."""
    checks: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...] = (
        (InvalidInput, "invalid"),
        (Refused, "refused"),
        (NotFound, "not_found"),
        (InferenceTimeout, "timeout"),
        (DeadlineExceeded, "deadline"),
        ((NotReady, DependencyUnavailable, ModelLoadError), "unavailable"),
    )
    return next((label for kind, label in checks if isinstance(exc, kind)), "failed")


class HotSetCollector(Collector):
    """``examlops_hotset_loaded{model,alias,version}``: read from the hot set at scrape time."""

    def __init__(self, hotset: HotSet) -> None:
        self._hotset = hotset

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("examlops_hotset_loaded", "Loaded versions (1 ready, 0.5 degraded)", labels=[])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "examlops_hotset_loaded", "Loaded versions (1 ready, 0.5 degraded)", labels=["model", "alias", "version"]
        )
        for info in self._hotset.entries():
            if info.version is not None and info.state in ("ready", "degraded"):
                value = 1.0 if info.state == "ready" else 0.5
                family.add_metric([info.model, info.alias or PINNED_ALIAS, info.version], value)
        yield family


class PipelineMetrics:
    """Every metric of one pipeline, on ``registry``."""

    def __init__(self, registry: CollectorRegistry, hotset: HotSet) -> None:
        labels = ("model", "alias")
        self.requests = Counter("examlops_requests", "Requests by outcome", [*labels, "outcome"], registry=registry)
        self.latency = Histogram(
            "examlops_request_latency_seconds", "Request latency", labels, buckets=LATENCY_BUCKETS, registry=registry
        )
        self.batch_size = Histogram(
            "examlops_batch_size", "Requests per flushed batch", buckets=(1, 2, 4, 8, 16, 24, 32, 64), registry=registry
        )
        self.in_flight = Gauge("examlops_requests_in_flight", "Requests being served", registry=registry)
        self.refusals = Counter(
            "examlops_refusals",
            "Calls refused for their budget: early (estimate over budget) or late (ran out, or would, while queued)",
            ["model", "task", "identity", "when"],
            registry=registry,
        )
        self.estimate_error = Histogram(
            "examlops_admission_error_ms",
            "Answered calls' actual time minus the admission estimate, in milliseconds",
            ["model"],
            buckets=ERROR_BUCKETS_MS,
            registry=registry,
        )
        registry.register(HotSetCollector(hotset))
