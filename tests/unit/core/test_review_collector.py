"""``quiet_collector`` collects start-up's garbage before it freezes: an unreachable cycle is not kept for good."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from examlops.core.collector import quiet_collector


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
def test_garbage_left_by_start_up_is_not_frozen_for_the_life_of_the_process() -> None:
    # A cycle start-up (loading the hot set, a previous app in the same test process) left unreachable.
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    quiet_collector()  # as serving's lifespan calls it
    gc.collect()
    assert gone() is None, "an unreachable cycle frozen at start-up is never collected"
