"""``StreamRun``: chunks in order, the deadline checked at every boundary, queued work cancelled."""

from __future__ import annotations

import asyncio
import gc
import json

import pytest

from examlops.api.stream_run import StreamRun
from examlops.core.errors import InvalidInput
from examlops.core.messages import InferenceRequest, InferenceResult


class HeldPipeline:
    """Answers the first ``answer`` requests at once; the rest wait until cancelled."""

    def __init__(self, answer: int) -> None:
        self.answer = answer
        self.submitted: list[InferenceRequest] = []
        self.cancelled = 0

    async def infer(self, request: InferenceRequest) -> InferenceResult:
        self.submitted.append(request)
        if len(self.submitted) > self.answer:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return InferenceResult(request.model, "Production", "1", None, float(request.node_count))


def admit_all(request: InferenceRequest, rows: int) -> None:
    return None


def requests(n: int, deadline: float | None = 100.0) -> list[InferenceRequest]:
    return [InferenceRequest("JPCP", (0.1,), i + 1, deadline=deadline) for i in range(n)]


async def test_a_deadline_passed_at_a_chunk_boundary_ends_the_stream_expired_and_cancels_the_queued_work() -> None:
    now = [0.0]
    pipeline = HeldPipeline(answer=2)
    run = StreamRun(
        pipeline.infer,
        requests(8),
        admit=admit_all,
        size=2,
        window=2,
        deadline=100.0,
        budget_ms=100_000.0,
        wall=lambda: now[0],
    )
    assert [r.prediction for r in await run.first()] == [1.0, 2.0]
    lines = run.lines()
    first = json.loads(await anext(lines))
    assert (first["chunk"], first["budget_remaining_ms"]) == (0, 100_000.0)
    now[0] = 100.0  # the budget runs out before the next chunk is awaited
    [end] = [json.loads(line) async for line in lines]
    assert (end["done"], end["expired"], end["answered"], end["instances"]) == (True, True, 2, 8)
    assert end["budget_remaining_ms"] == 0.0 and run.ended == "refused"
    await asyncio.sleep(0)
    assert len(pipeline.submitted) == 6 and pipeline.cancelled == 4  # chunks 1 and 2 were queued ahead, never run


async def test_only_a_window_of_chunks_is_submitted_ahead_of_the_one_being_answered() -> None:
    pipeline = HeldPipeline(answer=100)
    run = StreamRun(
        pipeline.infer, requests(40, None), admit=admit_all, size=4, window=1, deadline=None, budget_ms=None
    )
    await run.first()
    assert len(pipeline.submitted) == 8
    out = [json.loads(line) async for line in run.lines()]
    assert [line.get("start") for line in out[:-1]] == list(range(0, 40, 4))
    assert out[-1]["answered"] == 40 and run.ended is None


async def test_a_bad_instance_in_the_first_chunk_is_raised_naming_its_index_and_nothing_stays_queued() -> None:
    async def infer(request: InferenceRequest) -> InferenceResult:
        if request.node_count == 3:
            raise InvalidInput("expected 384 values, got 1", field="embedding")
        await asyncio.sleep(0)
        return InferenceResult(request.model, "Production", "1", None, 0.5)

    run = StreamRun(infer, requests(10), admit=admit_all, size=4, window=2, deadline=None, budget_ms=None)
    with pytest.raises(InvalidInput) as caught:
        await run.first()
    assert caught.value.field == "instances.2.embedding"


async def test_outcomes_of_chunks_no_longer_wanted_are_not_left_unread(caplog: pytest.LogCaptureFixture) -> None:
    async def infer(request: InferenceRequest) -> InferenceResult:
        if request.node_count > 2:
            raise InvalidInput("bad", field="embedding")
        return InferenceResult(request.model, "Production", "1", None, 0.5)

    run = StreamRun(infer, requests(12, None), admit=admit_all, size=2, window=4, deadline=None, budget_ms=None)
    await run.first()
    out = [json.loads(line) async for line in run.lines()]
    assert out[-1]["error"]["field"] == "instances.2.embedding"
    del run, out
    gc.collect()
    await asyncio.sleep(0)
    assert "never retrieved" not in caplog.text
