"""Admission under open-loop overload, on a virtual clock: the pipeline's own batcher, estimate and dispatcher
against a model whose batch of n rows takes a + b * n seconds, so what is shown is the policy, not the machine.

Issue 17's bound: with admission, at least 99 % of the calls admitted are answered within their budget at
every load, and past capacity the pool's goodput stays at least 80 % of it; without admission, the same
arrivals miss their budgets (``bench/overload.py`` measures the same on a real server). Shown here for
tight budgets of 300 and 200 ms (about two and one and a half full batches) beside loose ones of 3 s.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from examlops.core.errors import Refused
from examlops.core.setting_sections import AdmissionSettings, BatchSettings, HotSetSettings, PredictSettings
from examlops.core.settings import Settings
from examlops.serving.pipeline import Pipeline
from tests.unit.serving.fakes import InMemoryModelSource, InMemoryTrafficRules, RecordingRuntime, make_catalog
from tests.unit.serving.test_pipeline import req

pytestmark = pytest.mark.looptime

FIXED_S, PER_ROW_S, MAX_SIZE = 0.005, 0.004, 32
TIGHT_S, LOOSE_S = 0.3, 3.0


KNN = (0.045, 0.0021)
"""bench/overload.py's model, measured: a brute-force k-NN over 100,000 rows (45 ms a batch, 2.1 ms a row)."""


class Costly(RecordingRuntime):
    """A batch of n rows takes ``fixed_s + per_row_s * n`` of (virtual) time."""

    def __init__(self, fixed_s: float, per_row_s: float) -> None:
        super().__init__()
        self.fixed_s, self.per_row_s = fixed_s, per_row_s

    async def predict(self, key: str, rows: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        await asyncio.sleep(self.fixed_s + self.per_row_s * len(rows))
        return await super().predict(key, rows)


async def overload(
    home: Path,
    load: float,
    admission: bool,
    *,
    tight_s: float = TIGHT_S,
    shape: tuple[float, float] = (FIXED_S, PER_ROW_S),
    seconds: float = 3.0,
) -> Counter[str]:
    """Poisson arrivals at ``load`` times the capacity for ``seconds``, half tight and half loose budgets.
    ``in window``: the calls answered within their budget before the arrivals ended (the goodput)."""
    loop = asyncio.get_running_loop()

    def wall() -> float:
        return 1.0e6 + loop.time()

    source = InMemoryModelSource()
    source.add("JPCP", "1", "Production")
    settings = Settings(
        home=home,
        batch=BatchSettings(max_size=MAX_SIZE, max_wait_ms=5),
        hotset=HotSetSettings(reload_poll_s=0),
        predict=PredictSettings(workers=1),
        admission=AdmissionSettings(enabled=admission),
    )
    capacity = MAX_SIZE / (shape[0] + shape[1] * MAX_SIZE)
    pipeline = Pipeline(
        settings, make_catalog("JPCP"), source, InMemoryTrafficRules(), Costly(*shape), clock=loop.time, wall=wall
    )
    await pipeline.start()
    try:
        for _ in range(10):  # the estimate learns the model's times, full batches among them
            await asyncio.gather(*(pipeline.infer(req(3, deadline=wall() + 10)) for _ in range(MAX_SIZE)))
        outcomes: Counter[str] = Counter()

        async def call(budget_s: float) -> None:
            began = loop.time()
            try:
                await pipeline.infer(req(3, deadline=wall() + budget_s, budget_ms=budget_s * 1000))
                outcomes["within" if loop.time() - began <= budget_s else "late answer"] += 1
                if loop.time() - began <= budget_s and loop.time() <= end:
                    outcomes["in window"] += 1
            except Refused as refused:
                outcomes["refused early" if refused.reason == "budget" else "refused late"] += 1

        rng, calls = random.Random(7), []
        at, end = loop.time(), loop.time() + seconds
        while (at := at + rng.expovariate(load * capacity)) < end:
            await asyncio.sleep(at - loop.time())
            calls.append(asyncio.ensure_future(call(tight_s if rng.random() < 0.5 else LOOSE_S)))
        await asyncio.gather(*calls)
        return outcomes
    finally:
        await pipeline.close()


@pytest.mark.parametrize(
    ("load", "tight_s", "shape"),
    [(0.5, 0.3, None), (1, 0.3, None), (2, 0.3, None), (4, 0.3, None), (1, 0.2, None), (4, 0.2, None), (2, 0.3, KNN)],
)
async def test_with_admission_the_calls_admitted_are_answered_within_their_budget_at_every_load(
    tmp_path: Path, load: float, tight_s: float, shape: tuple[float, float] | None
) -> None:
    shape = shape or (FIXED_S, PER_ROW_S)
    outcomes = await overload(tmp_path, load, admission=True, tight_s=tight_s, shape=shape)
    capacity = MAX_SIZE / (shape[0] + shape[1] * MAX_SIZE)
    answered_or_refused = sum(n for outcome, n in outcomes.items() if outcome != "in window")
    admitted = answered_or_refused - outcomes["refused early"]
    assert outcomes["within"] >= 0.99 * admitted, outcomes
    if load >= 2:  # past capacity some are refused at once, and the pool still answers about its capacity
        assert outcomes["refused early"] > 0
        assert outcomes["in window"] / 3.0 >= 0.8 * capacity, outcomes


async def test_without_admission_the_same_overload_misses_most_budgets(tmp_path: Path) -> None:
    outcomes = await overload(tmp_path, 4, admission=False)
    assert outcomes["refused early"] == 0
    assert outcomes["within"] < 0.5 * (sum(outcomes.values()) - outcomes["in window"]), outcomes
