"""``load_governor``: serving's collector governor over the pipeline's calls in flight, or none."""

from __future__ import annotations

import gc
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from examlops.bootstrap.serving import load_governor
from examlops.core.settings import Settings


def test_the_governor_reads_the_pipelines_calls_in_flight_at_the_settings_threshold(tmp_path: Any) -> None:
    pipeline: Any = SimpleNamespace(in_flight=0)
    registry = CollectorRegistry()
    governor = load_governor(Settings(home=tmp_path), pipeline, registry)
    assert governor is not None
    assert registry.get_sample_value("examlops_gc_deferred") == 0.0
    pipeline.in_flight = 127
    governor.step()
    assert not governor.holding
    pipeline.in_flight = 128
    was = gc.isenabled()
    gc.enable()  # as serving runs; another test may have left it off
    try:
        governor.step()
        assert governor.holding
        pipeline.in_flight = 0
        governor.step()
        assert not governor.holding
    finally:
        if not was:
            gc.disable()


def test_a_threshold_of_0_means_no_governor(tmp_path: Any) -> None:
    settings = Settings(home=tmp_path, serving={"collector_pause_at": 0})
    assert load_governor(settings, SimpleNamespace(in_flight=500), CollectorRegistry()) is None  # type: ignore[arg-type]
