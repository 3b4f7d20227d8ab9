"""What the models page shows per alias, from the views with serving's real rate history."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from examlops.core.settings import Settings
from examlops.dashboard import DashboardSources, views
from examlops.dashboard.rates import RateHistory
from examlops.identity import SYSTEM_CALLER
from examlops.registry.catalog import load_catalog
from examlops.serving.hotset import EntryInfo
from examlops.serving.metrics import PINNED_ALIAS
from tests.unit.dashboard.fakes import HotPipeline
from tests.unit.dashboard.test_rates import Clock, metrics


@dataclass
class PinnedPipeline(HotPipeline):
    """The hot set also holds version 3 of JPCP, loaded for requests that pin it (no alias)."""

    def hot_set(self) -> Sequence[Any]:
        return [*super().hot_set(), EntryInfo("JPCP", None, "3", "run-JPCP-3", 1.7e9, "ready")]


def test_a_pinned_version_shows_the_rates_serving_counts_under_pinned(settings: Settings) -> None:
    registry, clock = CollectorRegistry(), Clock()
    requests, latency = metrics(registry)
    history = RateHistory(registry, clock=clock)
    history.sample()
    for _ in range(10):
        requests.labels("JPCP", PINNED_ALIAS, "ok").inc()
        latency.labels("JPCP", PINNED_ALIAS).observe(0.004)
        requests.labels("JPCP", "Production", "ok").inc()
    clock.now += 5
    history.sample()
    pipeline = PinnedPipeline(load_catalog(settings.catalog_path))
    view = views.models_view(SYSTEM_CALLER, settings, pipeline, DashboardSources(), history)
    [jpcp] = [m for m in view["models"] if m["name"] == "JPCP"]
    by_alias = {a["alias"]: a["rates"] for a in jpcp["aliases"]}
    assert by_alias[None]["rps"] == 2.0 and by_alias[None]["p50_ms"] is not None
    assert by_alias["Production"]["rps"] == 2.0 and by_alias["Canary"] == {}
