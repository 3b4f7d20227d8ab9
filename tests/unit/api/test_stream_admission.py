"""A stream through the real pipeline (fake runtime): admitted or refused once, at its start, for its first
chunk; no later chunk is refused early on its own, it ends at the deadline instead."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from examlops.api.stream_run import StreamRun
from examlops.core.errors import Refused
from examlops.core.messages import InferenceRequest
from examlops.core.settings import PredictSettings
from examlops.serving.pipeline import Pipeline
from tests.unit.serving.test_pipeline import World, req

BUDGET_S = 60.0


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    w = World(tmp_path)
    w.source.add("JPCP", "1", "Production")
    yield w
    for built in w.pipelines:
        await built.close()


def stream(world: World, n: int, **kw: object) -> list[InferenceRequest]:
    deadline = world.wall.now + BUDGET_S
    return [req(i + 1, deadline=deadline, budget_ms=BUDGET_S * 1000, task="t.stream", **kw) for i in range(n)]


def slow(pipeline: Pipeline, ms: float) -> None:
    """The cost model now says every batch of JPCP takes ``ms``, whatever it observed before."""
    for size in (1, 2, 4, 8, 16, 32):
        for _ in range(40):
            pipeline.estimator.costs.observe("JPCP", size, ms)


async def test_later_chunks_of_an_admitted_stream_are_not_refused_early_when_the_estimate_grows(
    world: World,
) -> None:
    pipeline = world.pipeline(predict=PredictSettings(workers=1))
    await pipeline.start()
    asked: list[int] = []

    def admit(request: InferenceRequest, rows: int) -> None:
        asked.append(rows)
        pipeline.admit(request, rows)

    requests = stream(world, 6)
    deadline = requests[0].deadline
    run = StreamRun(
        pipeline.infer,
        requests,
        admit=admit,
        size=2,
        window=1,
        deadline=deadline,
        budget_ms=BUDGET_S * 1000,
        wall=world.wall,
    )
    assert [r.prediction for r in await run.first()] == [1001, 1002]
    # 8 s of the budget left; the estimate now says a batch takes 5 s and has lately been seconds late (its
    # margin): a call sent now is refused early, but the stream was admitted at its start and its later chunks,
    # each of which a batch alone would still answer in time, run until its deadline.
    world.wall.advance(BUDGET_S - 8)
    slow(pipeline, 5_000.0)
    for _ in range(40):
        pipeline.estimator.observe_error("JPCP", 5_000.0, asyncio.get_running_loop().time(), estimate_ms=0.0)
    with pytest.raises(Refused):
        await pipeline.infer(req(99, deadline=deadline, budget_ms=BUDGET_S * 1000))
    *chunks, end = [json.loads(line) async for line in run.lines()]
    assert [c["start"] for c in chunks] == [0, 2, 4]
    assert (end["answered"], end["expired"], end["error"]) == (6, False, None)
    assert asked == [2]  # admission was asked once, for the first chunk's two rows
    assert world.sample("examlops_refusals_total", model="JPCP", task="t.stream", identity="", when="early") is None


async def test_a_stream_that_cannot_start_within_its_budget_is_refused_before_any_row_is_queued(
    world: World,
) -> None:
    pipeline = world.pipeline(predict=PredictSettings(workers=1))
    await pipeline.start()
    slow(pipeline, 2 * BUDGET_S * 1000)
    requests = stream(world, 6)
    deadline = requests[0].deadline
    run = StreamRun(
        pipeline.infer,
        requests,
        admit=pipeline.admit,
        size=2,
        window=1,
        deadline=deadline,
        budget_ms=BUDGET_S * 1000,
        wall=world.wall,
    )
    with pytest.raises(Refused) as refused:
        await run.first()
    assert (refused.value.reason, refused.value.budget_ms, refused.value.deadline) == ("budget", 60_000, deadline)
    assert refused.value.estimate_ms is not None and refused.value.estimate_ms > BUDGET_S * 1000
    assert pipeline._batcher.queued() == [] and world.runtime.predicts == []
    labels = {"model": "JPCP", "task": "t.stream", "identity": "", "when": "early"}
    assert world.sample("examlops_refusals_total", **labels) == 1


async def test_admission_estimates_a_streams_first_chunk_as_its_rows_together(world: World) -> None:
    pipeline = world.pipeline(predict=PredictSettings(workers=1))
    await pipeline.start()
    pipeline.estimator.costs.observe("JPCP", 1, 10.0)
    pipeline.estimator.costs.observe("JPCP", 8, 80.0)
    first = stream(world, 1)[0]
    one, eight = pipeline.admit(first, 1), pipeline.admit(first, 8)
    assert one is not None and eight is not None and eight - one == pytest.approx(70.0)
