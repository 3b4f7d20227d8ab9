"""Admission control in the pipeline: early refusals are never queued, expired calls never reach a worker,
the estimate follows what serving observes, background work goes last."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from examlops.core.errors import Refused
from examlops.core.messages import InferenceRequest
from examlops.core.setting_sections import AdmissionSettings, PredictSettings
from examlops.serving.admission import Estimator
from examlops.serving.ledger import Ledger
from examlops.serving.waiters import InFlight
from tests.unit.serving.test_pipeline import World, eventually, req


@pytest.fixture
async def busy_world(tmp_path: Path) -> AsyncIterator[World]:
    """One model on one worker whose predicts wait for ``runtime.gate``."""
    world = World(tmp_path)
    world.source.add("JPCP", "1", "Production")
    world.runtime.gate = asyncio.Event()
    yield world
    world.runtime.gate.set()
    for built in world.pipelines:
        await built.close()


async def test_a_call_whose_estimate_exceeds_its_budget_is_refused_at_once_and_never_queued(busy_world: World) -> None:
    world = busy_world
    pipeline = world.pipeline(predict=PredictSettings(workers=1))
    await pipeline.start()
    pipeline.estimator.costs.observe("JPCP", 1, 100.0)  # this model takes 100 ms a call
    held = [asyncio.create_task(pipeline.infer(req(i))) for i in range(1, 4)]
    await eventually(lambda: len(world.runtime.predicts) == 1)
    predicts_before = list(world.runtime.predicts)
    queued_before = pipeline._batcher.queued()

    with pytest.raises(Refused) as refused:
        await pipeline.infer(req(9, deadline=world.wall.now + 0.05, task="t.one", identity="robot-7"))
    assert refused.value.reason == "budget"
    assert refused.value.estimate_ms is not None and refused.value.estimate_ms > 50
    assert refused.value.retry_after_s >= 1
    assert pipeline._batcher.queued() == queued_before  # never queued
    labels = {"model": "JPCP", "task": "t.one", "identity": "robot-7", "when": "early"}
    assert world.sample("examlops_refusals_total", **labels) == 1

    world.runtime.gate.set()  # type: ignore[union-attr]
    await asyncio.gather(*held)
    assert world.runtime.predicts[: len(predicts_before)] == predicts_before
    assert all(count != 9 for _, count in world.runtime.predicts)  # never reached a worker
    assert sum(n for _, n in world.runtime.predicts) == 3


async def test_a_call_within_its_budget_is_admitted_and_the_estimate_error_is_recorded(busy_world: World) -> None:
    world = busy_world
    world.runtime.gate.set()  # type: ignore[union-attr]
    pipeline = world.pipeline(predict=PredictSettings(workers=1))
    await pipeline.start()
    result = await pipeline.infer(req(4, deadline=world.wall.now + 5))
    assert result.prediction == 1004
    assert world.sample("examlops_admission_error_ms_count", model="JPCP") == 1


async def test_with_admission_off_the_same_call_is_queued_and_refused_late(busy_world: World) -> None:
    world = busy_world
    pipeline = world.pipeline(predict=PredictSettings(workers=1), admission=AdmissionSettings(enabled=False))
    await pipeline.start()
    pipeline.estimator.costs.observe("JPCP", 1, 100.0)
    held = [asyncio.create_task(pipeline.infer(req(i))) for i in range(1, 4)]
    await eventually(lambda: len(world.runtime.predicts) == 1)
    late = asyncio.create_task(pipeline.infer(req(9, deadline=world.wall.now + 0.05)))
    await asyncio.sleep(0.1)  # its budget runs out while the worker is held
    world.runtime.gate.set()  # type: ignore[union-attr]
    with pytest.raises(Refused) as refused:
        await late
    assert refused.value.reason == "late"
    await asyncio.gather(*held)
    assert all(count != 9 for _, count in world.runtime.predicts)
    assert world.sample("examlops_refusals_total", model="JPCP", task="", identity="", when="late") == 1


async def test_background_work_waits_behind_every_interactive_call(busy_world: World) -> None:
    world = busy_world
    pipeline = world.pipeline(predict=PredictSettings(workers=1))
    await pipeline.start()
    first = asyncio.create_task(pipeline.infer(req(1)))
    await eventually(lambda: len(world.runtime.predicts) == 1)
    second = asyncio.create_task(pipeline.infer(req(2)))  # waits: the one worker's batch is in flight
    background = asyncio.create_task(pipeline.infer(req(50), background=True))
    await asyncio.sleep(0.01)
    interactive = asyncio.create_task(pipeline.infer(req(60)))
    await asyncio.sleep(0.01)
    world.runtime.gate.set()  # type: ignore[union-attr]
    results = await asyncio.gather(first, second, interactive, background)
    assert [r.prediction for r in results] == [1001, 1002, 1060, 1050]
    assert world.runtime.predicts[1:] == [("JPCP/1", 2), ("JPCP/1", 1)]  # the background call last, alone


async def test_a_budgeted_call_whose_budget_is_gone_on_entry_is_refused_not_an_error(busy_world: World) -> None:
    world = busy_world
    pipeline = world.pipeline()
    await pipeline.start()
    with pytest.raises(Refused) as refused:
        await pipeline.infer(req(3, deadline=world.wall.now - 0.001, budget_ms=5))
    assert refused.value.reason == "budget"
    assert world.runtime.predicts == []


async def test_every_refusal_notes_the_budget_and_deadline_of_the_call_it_refuses(busy_world: World) -> None:
    world = busy_world
    pipeline = world.pipeline(predict=PredictSettings(workers=1))
    await pipeline.start()
    pipeline.estimator.costs.observe("JPCP", 1, 100.0)
    early_end, gone_end = world.wall.now + 0.05, world.wall.now - 0.001
    with pytest.raises(Refused) as early:
        await pipeline.infer(req(3, deadline=early_end, budget_ms=50))
    with pytest.raises(Refused) as gone:
        await pipeline.infer(req(3, deadline=gone_end, budget_ms=5))
    with pytest.raises(Refused) as unbudgeted:
        await pipeline.infer(req(3, deadline=early_end))
    assert (early.value.reason, early.value.budget_ms, early.value.deadline) == ("budget", 50, early_end)
    assert (gone.value.reason, gone.value.budget_ms, gone.value.deadline) == ("budget", 5, gone_end)
    assert (unbudgeted.value.budget_ms, unbudgeted.value.deadline) == (None, early_end)


async def test_a_request_whose_deadline_passes_while_its_group_waits_for_a_worker_never_reaches_one(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    world.source.add("JPCP", "1", "Production")
    world.source.add("CRCP", "1", "Production")
    world.runtime.gate = asyncio.Event()
    pipeline = world.pipeline("JPCP", "CRCP", predict=PredictSettings(workers=1), max_wait_ms=50)
    try:
        await pipeline.start()
        # One batch, two groups (two models), one worker: the CRCP group waits for the JPCP group's worker.
        # Deadline order puts JPCP first in the batch, so its group takes the worker.
        first = asyncio.create_task(pipeline.infer(req(1, deadline=world.wall.now + 5)))
        second = asyncio.create_task(pipeline.infer(req(2, model="CRCP", deadline=world.wall.now + 10)))
        await eventually(lambda: len(world.runtime.predicts) == 1)
        world.wall.advance(20)  # the CRCP request's deadline passes while it waits for the worker
        world.runtime.gate.set()
        assert (await first).prediction == 1001
        with pytest.raises(Refused) as refused:
            await second
        assert refused.value.reason == "late"
        assert world.runtime.predicts == [("JPCP/1", 1)]
    finally:
        world.runtime.gate.set()
        await pipeline.close()


async def test_a_queued_call_is_refused_late_at_its_deadline_not_when_a_worker_frees(busy_world: World) -> None:
    world = busy_world
    pipeline = world.pipeline(predict=PredictSettings(workers=1), admission=AdmissionSettings(enabled=False))
    await pipeline.start()
    held = asyncio.create_task(pipeline.infer(req(1)))
    await eventually(lambda: len(world.runtime.predicts) == 1)
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(Refused) as refused:
        await pipeline.infer(req(9, deadline=world.wall.now + 0.05, budget_ms=50))
    assert (refused.value.reason, refused.value.budget_ms) == ("late", 50)
    assert loop.time() - began < 2.0  # the worker is still held: the refusal came at the deadline
    assert pipeline._batcher.queued() == []  # and the call left the queue
    world.runtime.gate.set()  # type: ignore[union-attr]
    await held
    assert all(count != 9 for _, count in world.runtime.predicts)


class FakeQueue:
    """What the estimate reads: calls waiting (key, due, request), in a real ``Ledger``, and the batches
    ``running``."""

    def __init__(
        self,
        waiting: list[tuple[float, float, InferenceRequest]],
        running: list[InFlight[InferenceRequest]] | None = None,
        forming: list[tuple[float, float, InferenceRequest]] | None = None,
    ) -> None:
        self.ledger = Ledger()
        for seq, (key, due, request) in enumerate(waiting):
            self.ledger.add(key, seq, due, request.model)
        self._running = running or []
        self._forming = forming or []

    def forming(self) -> list[tuple[float, float, InferenceRequest]]:
        return list(self._forming)

    def in_flight(self) -> list[InFlight[InferenceRequest]]:
        return list(self._running)


@pytest.mark.parametrize(("queued_due_s", "admitted"), [(0.1, True), (0.07, False)])
def test_a_tight_call_is_refused_when_it_would_make_an_admitted_call_behind_it_miss(
    queued_due_s: float, admitted: bool
) -> None:
    now = 100.0
    behind = (now + queued_due_s, now + queued_due_s, req(1))  # admitted earlier, a later deadline
    estimator = Estimator(AdmissionSettings(overhead_ms=2.0, headroom=0.0), FakeQueue([behind]), workers=1, max_size=1)
    estimator.costs.observe("JPCP", 1, 40.0)  # 40 ms a row
    # The tight call fits its own 50 ms (40 + 2 ms); it delays the call behind by 40 ms, whose slack is
    # 100 - 40 - 2 = 58 ms (enough) or 70 - 40 - 2 = 28 ms (not).
    if admitted:
        assert estimator.admit("JPCP", now + 0.05, now) == pytest.approx(42.0)
    else:
        with pytest.raises(Refused) as refused:
            estimator.admit("JPCP", now + 0.05, now)
        assert refused.value.reason == "budget"


def test_on_ray_a_call_waits_only_for_its_own_models_work_over_that_models_replicas() -> None:
    now = 100.0
    crcp = [(now + 1.0, now + 1.0, req(1, model="CRCP")) for _ in range(8)]  # ahead of it, another model
    running = [InFlight(now, [req(1, model="CRCP")] * 4), InFlight(now, [req(1)])]
    settings = AdmissionSettings(overhead_ms=2.0, headroom=0.0)
    shared = Estimator(settings, FakeQueue(crcp, running), workers=2, max_size=1)
    per_model = Estimator(settings, FakeQueue(crcp, running), workers=2, max_size=1, per_model=True)
    for estimator in (shared, per_model):
        estimator.costs.observe("JPCP", 1, 10.0)
        estimator.costs.observe("CRCP", 1, 100.0)
    # Its own model: half of the 10 ms JPCP batch in flight (2 replicas), then its own 10 ms and 2 ms.
    assert per_model.estimate_ms("JPCP", now + 5.0, now) == (pytest.approx(17.0), pytest.approx(5.0))
    # On one pool, CRCP's 8 queued and its batch of 4 in flight (400 ms: 100 a row) count too:
    # (800 + 400 + 10) / 2 + 12.
    assert shared.estimate_ms("JPCP", now + 5.0, now)[0] == pytest.approx(617.0)
    assert not per_model.endangers("JPCP", now + 0.05, now)  # CRCP's callers are not delayed by it


def test_a_batch_in_flight_keeps_the_expected_time_it_had_when_the_estimate_first_saw_it() -> None:
    now = 100.0
    running = [InFlight(now, [req(1)] * 4)]
    estimator = Estimator(
        AdmissionSettings(overhead_ms=0.0, headroom=0.0), FakeQueue([], running), workers=1, max_size=4
    )
    estimator.costs.observe("JPCP", 4, 40.0)
    assert estimator.estimate_ms("JPCP", now + 5.0, now + 0.01)[1] == pytest.approx(30.0)  # 40 ms, 10 gone
    estimator.costs.observe("JPCP", 4, 1040.0)  # batches of 4 now take longer on average
    later_ms = estimator.costs.predict_ms("JPCP", 4)
    assert later_ms > 200.0
    assert estimator.estimate_ms("JPCP", now + 5.0, now + 0.02)[1] == pytest.approx(20.0)  # still 40 ms
    running.append(InFlight(now + 0.02, [req(1)] * 4))  # a batch started after the change: the new time
    assert estimator.estimate_ms("JPCP", now + 5.0, now + 0.02)[1] == pytest.approx(20.0 + later_ms)


def test_on_ray_a_call_endangers_only_calls_of_its_own_model() -> None:
    now = 100.0
    crcp = [(now + 0.015, now + 0.015, req(1, model="CRCP"))]  # behind it: 15 ms left, 10 of them its own
    settings = AdmissionSettings(overhead_ms=0.0, headroom=0.0)
    shared = Estimator(settings, FakeQueue(crcp), workers=1, max_size=1)
    per_model = Estimator(settings, FakeQueue(crcp), workers=1, max_size=1, per_model=True)
    for estimator in (shared, per_model):
        estimator.costs.observe("JPCP", 1, 10.0)
        estimator.costs.observe("CRCP", 1, 10.0)
    assert shared.endangers("JPCP", now + 0.01, now)  # one pool: its 10 ms push the CRCP call past its deadline
    assert not per_model.endangers("JPCP", now + 0.01, now)  # its own replicas: the CRCP call is not delayed


@pytest.mark.parametrize("forming", [0, 3, 4])
def test_the_batch_being_formed_is_work_ahead_of_every_call(forming: int) -> None:
    now = 100.0
    batch = [(now + 1.0, now + 1.0, req(1))] * forming  # taken from the queue, not yet handed over
    behind = [(now + 0.085, now + 0.085, req(1))]  # 85 ms left, 10 of them its own
    estimator = Estimator(
        AdmissionSettings(overhead_ms=0.0, headroom=0.0), FakeQueue(behind, forming=batch), workers=1, max_size=4
    )
    for size in (1, 4):
        estimator.costs.observe("JPCP", size, 10.0 * size)
    ahead_ms = 10.0 * forming
    # A call due later waits for the forming batch and the queued call.
    assert estimator.estimate_ms("JPCP", now + 5.0, now)[1] == pytest.approx(ahead_ms + 10.0)
    # The queued call keeps 85 - forming - its own 10 - its batch's 3 other rows (30): a tight call endangers
    # it once that slack is under the tight call's 10 ms (with 4 forming: 5 ms).
    assert estimator.endangers("JPCP", now + 0.01, now) == (forming == 4)


def test_a_call_needs_the_margin_of_the_estimates_recent_late_error_to_spare_and_the_margin_decays() -> None:
    now = 100.0
    estimator = Estimator(AdmissionSettings(overhead_ms=0.0, headroom=0.0), FakeQueue([]), workers=1, max_size=1)
    for model in ("JPCP", "CRCP"):
        estimator.costs.observe(model, 1, 40.0)
    assert estimator.admit("JPCP", now + 0.045, now) == pytest.approx(40.0)  # 5 ms to spare
    for _ in range(100):
        estimator.observe_error("jpcp", 10.0, now, estimate_ms=0.0)  # answered 10 ms late, every time
    with pytest.raises(Refused) as refused:
        estimator.admit("JPCP", now + 0.045, now)  # 40 ms + a margin near 20 ms
    assert refused.value.estimate_ms == pytest.approx(60.0, abs=0.2)
    assert estimator.admit("CRCP", now + 0.045, now) == pytest.approx(40.0)  # another model: no margin
    for _ in range(100):
        estimator.observe_error("JPCP", -5.0, now, estimate_ms=0.0)  # early: no late part, the margin fades
    assert estimator.admit("JPCP", now + 0.045, now) == pytest.approx(40.0)


def test_a_margin_that_refuses_every_call_fades_with_time_so_the_model_is_admitted_again() -> None:
    now = 100.0
    estimator = Estimator(AdmissionSettings(overhead_ms=0.0, headroom=0.0), FakeQueue([]), workers=1, max_size=1)
    estimator.costs.observe("JPCP", 1, 5.0)
    for _ in range(40):
        estimator.observe_error("JPCP", 60.0, now, estimate_ms=0.0)  # a stall: every call 60 ms late
    assert estimator.margin_ms("JPCP", now) > 100.0  # 120 ms x (1 - 0.95 ** 40)
    with pytest.raises(Refused):
        estimator.admit("JPCP", now + 0.1, now)  # 100 ms budget, idle queue: refused on the margin alone
    # Nothing is answered while every call is refused; the margin halves each second regardless.
    assert estimator.admit("JPCP", now + 3.1, now + 3.0) == pytest.approx(5.0)
    assert estimator.margin_ms("JPCP", now + 3.0) == pytest.approx(estimator.margin_ms("JPCP", now) / 8)
