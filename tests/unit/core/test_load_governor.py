"""``LoadGovernor``: automatic collection held off while many calls are in flight, on again below half as many;
a young collection at the cap while held; only what it switched off is switched on again."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry

from examlops.core.collector import LoadGovernor


@pytest.fixture(autouse=True)
def collector_as_cpython_starts() -> Iterator[None]:
    """Collection on at CPython's thresholds for each test (others in the process raise them, mypy to 200,000),
    and as it was after."""
    was, thresholds = gc.isenabled(), gc.get_threshold()
    gc.enable()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*thresholds)
    if was:
        gc.enable()
    else:
        gc.disable()


class Calls:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def deferred(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("examlops_gc_deferred")


async def eventually(check: Callable[[], bool], within_s: float = 2.0) -> None:
    async with asyncio.timeout(within_s):
        while not check():  # noqa: ASYNC110 - the governor's own task, with no event to wait on; polled briefly
            await asyncio.sleep(0.005)


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def unreachable_cycle() -> weakref.ref[Node]:
    """Two nodes that only refer to each other; the reference follows one until a collection frees it."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_collection_is_held_off_from_pause_at_calls_until_fewer_than_half_as_many() -> None:
    calls, registry = Calls(), CollectorRegistry()
    governor = LoadGovernor(calls, registry, pause_at=100)
    for now, held in ((99, False), (100, True), (50, True), (80, True), (49, False), (99, False), (120, True)):
        calls.now = now
        governor.step()
        assert governor.holding is held, now
        assert gc.isenabled() is not held, now
        assert deferred(registry) == (1.0 if held else 0.0), now


def test_a_cycle_made_while_held_off_is_collected_once_collection_is_on_again() -> None:
    calls = Calls()
    governor = LoadGovernor(calls, CollectorRegistry(), pause_at=10)
    calls.now = 10
    governor.step()
    gone = unreachable_cycle()
    kept: list[list[int]] = [[] for _ in range(30_000)]  # would trigger young collections, were collection on
    assert gone() is not None, "collected while held off"
    calls.now = 4
    governor.step()
    kept += [[] for _ in range(30_000)]  # allocations now trigger the young collection
    assert gone() is None
    assert len(kept) == 60_000


def test_at_the_cap_the_young_generation_is_collected_and_collection_stays_held_off() -> None:
    calls, registry = Calls(), CollectorRegistry()
    governor = LoadGovernor(calls, registry, pause_at=10, cap=5_000)
    calls.now = 10
    governor.step()
    gone = unreachable_cycle()
    kept: list[list[int]] = [[] for _ in range(6_000)]
    assert gc.get_count()[0] >= 5_000
    governor.step()
    assert gone() is None
    assert gc.get_count()[0] < 5_000
    assert governor.holding and not gc.isenabled()
    assert registry.get_sample_value("examlops_gc_held_collections_total") == 1
    assert len(kept) == 6_000


def test_collection_someone_else_switched_off_is_left_off() -> None:
    calls = Calls()
    governor = LoadGovernor(calls, CollectorRegistry(), pause_at=10)
    gc.disable()
    calls.now = 50
    governor.step()
    assert not governor.holding
    calls.now = 0
    governor.step()
    assert not gc.isenabled()


async def test_the_running_governor_follows_the_load_and_close_switches_collection_on_again() -> None:
    calls = Calls()
    governor = LoadGovernor(calls, CollectorRegistry(), pause_at=10, poll_s=0.005)
    governor.start()
    task = governor._task
    governor.start()
    assert governor._task is task, "a second start made a second task"
    calls.now = 12
    await eventually(lambda: governor.holding)
    assert not gc.isenabled()
    calls.now = 0
    await eventually(lambda: not governor.holding)
    assert gc.isenabled()
    calls.now = 12
    await eventually(lambda: governor.holding)
    await governor.close()
    assert gc.isenabled() and not governor.holding
    governor.start()
    assert governor._task is None, "started again after close"


async def test_a_governor_whose_task_is_cancelled_leaves_collection_on() -> None:
    calls = Calls()
    calls.now = 12
    governor = LoadGovernor(calls, CollectorRegistry(), pause_at=10, poll_s=0.005)
    governor.start()
    await eventually(lambda: governor.holding)
    assert governor._task is not None
    governor._task.cancel()  # as the loop's teardown cancels what is left
    await asyncio.gather(governor._task, return_exceptions=True)
    assert gc.isenabled() and not governor.holding


def test_collection_switched_on_by_someone_else_ends_the_hold() -> None:
    calls, registry = Calls(), CollectorRegistry()
    governor = LoadGovernor(calls, registry, pause_at=10)
    calls.now = 12
    governor.step()
    assert governor.holding
    gc.enable()
    governor.step()
    assert not governor.holding and registry.get_sample_value("examlops_gc_deferred") == 0.0
    governor.step()  # still loaded: held off again
    assert governor.holding and not gc.isenabled()


async def test_a_governor_whose_load_cannot_be_read_stops_with_collection_on(caplog: pytest.LogCaptureFixture) -> None:
    state = {"calls": 12}

    def in_flight() -> int:
        if state["calls"] < 0:
            raise RuntimeError("the pipeline is gone")
        return state["calls"]

    governor = LoadGovernor(in_flight, CollectorRegistry(), pause_at=10, poll_s=0.005)
    governor.start()
    await eventually(lambda: governor.holding)
    state["calls"] = -1
    await eventually(lambda: not governor.holding)
    assert gc.isenabled()
    assert "governor stopped" in caplog.text
    await governor.close()


@pytest.mark.parametrize("kwargs", [{"pause_at": 0}, {"pause_at": 10, "cap": 0}, {"pause_at": 10, "poll_s": 0}])
def test_settings_out_of_range_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="pause_at"):
        LoadGovernor(Calls(), CollectorRegistry(), **kwargs)  # type: ignore[arg-type]


async def test_close_passes_its_callers_cancellation_on_and_still_switches_collection_on() -> None:
    calls = Calls()
    calls.now = 12
    governor = LoadGovernor(calls, CollectorRegistry(), pause_at=10, poll_s=0.005)
    governor.start()
    await eventually(lambda: governor.holding)
    closing = asyncio.create_task(governor.close())
    await asyncio.sleep(0)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert gc.isenabled() and not governor.holding
