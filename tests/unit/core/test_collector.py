"""``quiet_collector``: start-up's garbage collected, the rest frozen, the youngest generation collected rarely,
cycles still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from examlops.core.collector import YOUNG, quiet_collector


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
