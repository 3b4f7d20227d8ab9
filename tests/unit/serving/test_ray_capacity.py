"""Predict slots per model on Ray (a model's replicas serve it alone), shared on the predict pool."""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from examlops.core.messages import InferenceRequest
from examlops.core.settings import BatchSettings, HotSetSettings, PredictSettings, Settings
from examlops.serving.dispatch import Capacity, predict_capacity
from examlops.serving.pipeline import Pipeline
from tests.unit.serving.fakes import DIM, InMemoryModelSource, InMemoryTrafficRules, RecordingRuntime, make_catalog


@dataclass
class Overlapping(RecordingRuntime):
    """Predicts that wait for a second one to run (briefly: a runtime that runs them one by one must end)."""

    model_capacity: int | None = None
    active: int = 0
    peak: int = 0
    both: asyncio.Event = field(default_factory=asyncio.Event)

    async def predict(self, key: str, rows: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        self.active += 1
        self.peak = max(self.peak, self.active)
        if self.active == 2:
            self.both.set()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.both.wait(), 0.5)
            return await super().predict(key, rows)
        finally:
            self.active -= 1


async def peak_of_two_models(tmp_path: Path, runtime: Overlapping) -> int:
    source = InMemoryModelSource()
    source.add("JPCP", "1", "Production")
    source.add("AC", "1", "Production")
    settings = Settings(
        home=tmp_path,
        batch=BatchSettings(max_size=32, max_wait_ms=1),
        hotset=HotSetSettings(reload_poll_s=0),
        predict=PredictSettings(workers=1),
    )
    pipeline = Pipeline(
        settings, make_catalog("JPCP", "AC"), source, InMemoryTrafficRules(), runtime, rng=random.Random(3)
    )
    await pipeline.start()
    try:
        calls = (InferenceRequest(model=m, embedding=(0.5,) * DIM, node_count=3) for m in ("JPCP", "AC"))
        results = await asyncio.gather(*(pipeline.infer(call) for call in calls))
    finally:
        await pipeline.close()
    assert [r.model for r in results] == ["JPCP", "AC"]
    return runtime.peak


async def test_on_ray_two_models_of_one_replica_each_predict_at_once(tmp_path: Path) -> None:
    assert await peak_of_two_models(tmp_path, Overlapping(model_capacity=1)) == 2


async def test_the_predict_pool_of_one_worker_still_predicts_one_call_at_a_time_over_all_models(
    tmp_path: Path,
) -> None:
    assert await peak_of_two_models(tmp_path, Overlapping()) == 1


def test_slots_are_per_model_on_ray_and_the_shared_workers_on_the_pool() -> None:
    assert predict_capacity(Overlapping(model_capacity=2), workers=1) == Capacity(2, per_model=True)
    assert predict_capacity(Overlapping(), workers=4) == Capacity(4)
