"""``quiet_collector``: start-up's garbage collected, the rest frozen, the youngest generation collected rarely,
cycles still collected; ``PauseMeter``: every collection timed, by generation."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from examlops.core.collector import YOUNG, PauseMeter, quiet_collector


@pytest.fixture
def restored() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.mark.usefixtures("restored")
def test_start_up_objects_are_frozen_and_young_objects_collected_every_young_allocations() -> None:
    before = gc.get_freeze_count()
    middle, old = gc.get_threshold()[1:]
    built = [Node() for _ in range(100)]  # start-up's objects
    quiet_collector()
    assert gc.get_freeze_count() >= before + len(built)
    assert gc.get_threshold() == (YOUNG, middle, old)


@pytest.mark.usefixtures("restored")
def test_a_reference_cycle_made_after_start_up_is_still_collected_by_the_collector_itself() -> None:
    quiet_collector()
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    # Allocations that trigger a young collection: no explicit collect.
    kept: list[list[int]] = [[] for _ in range(2 * YOUNG)]
    assert gone() is None
    assert len(kept) == 2 * YOUNG


@pytest.mark.usefixtures("restored")
def test_garbage_left_by_start_up_is_not_frozen_for_the_life_of_the_process() -> None:
    # A cycle start-up (loading the hot set, a previous app in the same test process) left unreachable.
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    quiet_collector()  # as serving's lifespan calls it
    gc.collect()
    assert gone() is None, "an unreachable cycle frozen at start-up is never collected"


def pauses_counted(registry: CollectorRegistry, generation: int) -> float:
    value = registry.get_sample_value("examlops_gc_pause_seconds_count", {"generation": str(generation)})
    return value or 0.0


def test_every_collection_is_timed_by_generation_while_the_meter_runs_and_none_after_it_stops() -> None:
    registry = CollectorRegistry()
    meter = PauseMeter(registry)
    meter.start()
    meter.start()  # idempotent: one callback, each collection counted once
    gc.disable()  # no automatic collection in between: only the two asked for below run
    try:
        gc.collect(0)
        gc.collect(2)
        assert pauses_counted(registry, 0) == 1
        assert pauses_counted(registry, 2) == 1
        total = registry.get_sample_value("examlops_gc_pause_seconds_sum", {"generation": "2"})
        assert total is not None and total > 0
    finally:
        gc.enable()
        meter.stop()
    meter.stop()  # stopping twice is harmless
    assert not any(getattr(callback, "__self__", None) is meter for callback in gc.callbacks)
    before = pauses_counted(registry, 2)
    gc.collect(2)
    assert pauses_counted(registry, 2) == before
