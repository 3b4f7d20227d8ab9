"""What guards a reload: a version of the wrong input width is refused; polling backs off while MLflow is down."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from examlops.core.settings import HotSetSettings, Settings
from examlops.serving.hotset import HotSet
from examlops.serving.pipeline import Pipeline, poll_backoff_ceiling
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


async def test_polling_backs_off_while_the_registry_is_unreachable_and_resumes_after(tmp_path: Path) -> None:
    source = InMemoryModelSource()
    source.add("JPCP", "1", "Production")
    settings = Settings(home=tmp_path, hotset=HotSetSettings(reload_poll_s=0.02))
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
        source.unavailable = True
        before = len(source.calls)
        await asyncio.sleep(0.6)
        down = len(source.calls) - before
        # Without back-off about 30 polls; with it 0.04 + 0.08 + 0.16 + 0.16 ... s: about 5.
        assert 2 <= down <= 8, down
        assert all("stale since" in (e.reason or "") for e in pipeline.hot_set() if e.version)
        source.unavailable = False
        source.add("JPCP", "2", "Production")
        async with asyncio.timeout(2):
            while next(e.version for e in pipeline.hot_set() if e.alias == "Production") != "2":  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert not any(e.reason and "stale" in e.reason for e in pipeline.hot_set())
    finally:
        await pipeline.close()
