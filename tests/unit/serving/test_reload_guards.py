"""What guards a reload: a version of the wrong input width is refused; polling backs off while MLflow is down."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from examlops.core.messages import ModelRef
from examlops.core.settings import HotSetSettings, Settings
from examlops.serving.hotset import HotSet
from examlops.serving.pipeline import Pipeline
from examlops.serving.upkeep import poll_backoff_ceiling
from tests.unit.serving.fakes import (
    DIM,
    FakeClock,
    InMemoryModelSource,
    InMemoryTrafficRules,
    RecordingRuntime,
    make_catalog,
)


@dataclass
class WidthRuntime(RecordingRuntime):
    """Reports ``widths[key]`` input columns for a loaded key (the catalog's row width otherwise)."""

    widths: dict[str, int] = field(default_factory=dict)

    async def load(self, key: str, location: str) -> int | None:  # type: ignore[override]  # fakes report a width
        await super().load(key, location)
        return self.widths.get(key, DIM + 1)


async def test_a_version_fitted_on_another_number_of_columns_is_refused_and_unloaded() -> None:
    source = InMemoryModelSource()
    source.add("JPCP", "1", "Production")
    source.add("JPCP", "2")
    runtime = WidthRuntime(widths={"JPCP/2": 10})
    hs = HotSet(make_catalog("JPCP"), source, runtime, clock=FakeClock())
    await hs.load_all()
    source.move("JPCP", "Production", "2")
    (change,) = await hs.reload("JPCP")
    assert (change.old_version, change.new_version, change.outcome) == ("1", "2", "refused")
    assert f"takes 10 input columns, the catalog gives {DIM + 1}" in (change.reason or "")
    assert "JPCP/2" in runtime.unloads and "JPCP/2" not in runtime.loaded
    entry = await hs.get("JPCP")
    assert (entry.ref.version, entry.state) == ("1", "degraded")


async def test_a_model_that_does_not_declare_its_width_is_accepted() -> None:
    source = InMemoryModelSource()
    source.add("JPCP", "1", "Production")
    runtime = RecordingRuntime()  # its load answers None
    hs = HotSet(make_catalog("JPCP"), source, runtime, clock=FakeClock())
    await hs.load_all()
    assert (await hs.get("JPCP")).state == "ready"


def test_the_backoff_ceiling_is_eight_intervals_and_at_most_ten_minutes() -> None:
    assert poll_backoff_ceiling(1) == 8
    assert poll_backoff_ceiling(60) == 480
    assert poll_backoff_ceiling(300) == 600
    assert poll_backoff_ceiling(900) == 900


@pytest.mark.looptime
async def test_polling_backs_off_while_the_registry_is_unreachable_and_resumes_after(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    source = InMemoryModelSource()
    source.add("JPCP", "1", "Production")
    polls: list[float] = []
    aliases = source.aliases

    def timed_aliases(name: str) -> Mapping[str, ModelRef]:
        polls.append(loop.time())
        return aliases(name)

    source.aliases = timed_aliases  # type: ignore[method-assign]  # a fake of ours, timed
    settings = Settings(home=tmp_path, hotset=HotSetSettings(reload_poll_s=60))
    pipeline = Pipeline(
        settings,
        make_catalog("JPCP"),
        source,
        InMemoryTrafficRules(),
        RecordingRuntime(),
        wall=FakeClock(),
        rng=random.Random(1),
        registry=CollectorRegistry(),
    )
    await pipeline.start()
    try:
        start = polls[-1]
        source.unavailable = True
        await asyncio.sleep(1000)
        # Every 60 s, then doubling while unreachable: 60, 120, 240, then the ceiling of 8 intervals (480).
        assert [round(t - start) for t in polls[1:]] == [60, 180, 420, 900]
        assert all("stale since" in (e.reason or "") for e in pipeline.hot_set() if e.version)
        source.unavailable = False
        source.add("JPCP", "2", "Production")
        await asyncio.sleep(900 + 480 - 1000 + 1)  # the next poll, at the ceiling, reaches the registry
        assert next(e.version for e in pipeline.hot_set() if e.alias == "Production") == "2"
        assert not any(e.reason and "stale" in e.reason for e in pipeline.hot_set())
        await asyncio.sleep(60)
        assert round(polls[-1] - start) == 900 + 480 + 60  # back to every 60 s
    finally:
        await pipeline.close()
