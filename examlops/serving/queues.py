"""The micro-batcher's waiting items, a heap per group (``serving.batcher``): ``GroupQueues``.

- ``push(waiter)``: into its group's heap (every item in group None without ``group``) and into ``ledger``
  (the waiting items as arrays, tallied by ``tally``: what admission reads).
- ``opening(full)``: the heap a batch opens from: without groups the only one, if not empty and not
  ``full(None)``; else, among the groups not ``full``, the one whose head comes first; None when there is none.
- ``take(heap, now)``: the next live item of ``heap``, out of the ledger: items already answered are dropped,
  and those whose ``due`` (loop time) has come, or with ``early_expiry`` would come before a batch of them
  alone is handled (as ``lead`` expects), fail with ``expired(item)``.
- ``group_of(waiter)``: its group (None without ``group``).
- ``waiting()`` iterates over every queued waiter; ``clear()`` empties the heaps and the ledger and returns
  what waited.

No loop and no task: the batcher owns those and creates the futures; ``take`` fails the expired ones.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

from examlops.serving.ledger import Ledger
from examlops.serving.waiters import Lead, Waiter, hopeless

T = TypeVar("T")
R = TypeVar("R")


class GroupQueues(Generic[T, R]):
    """The waiting items by group, and their ledger (contract above)."""

    def __init__(
        self,
        *,
        expired: Callable[[T], BaseException],
        lead: Lead[T] | None,
        early_expiry: bool,
        group: Callable[[T], Hashable] | None,
        tally: Callable[[T], str],
    ) -> None:
        self.ledger = Ledger()
        self._heaps: dict[Hashable, list[Waiter[T, R]]] = {None: []}
        self._expired = expired
        self._lead = lead
        self._early_expiry = early_expiry
        self._group = group
        self._tally = tally

    def group_of(self, waiter: Waiter[T, R]) -> Hashable:
        return None if self._group is None else self._group(waiter.item)

    def push(self, waiter: Waiter[T, R]) -> None:
        heapq.heappush(self._heaps.setdefault(self.group_of(waiter), []), waiter)
        self.ledger.add(waiter.key, waiter.seq, waiter.due, self._tally(waiter.item))

    def opening(self, full: Callable[[Hashable], bool]) -> list[Waiter[T, R]] | None:
        if self._group is None:
            heap = self._heaps[None]
            return heap if heap and not full(None) else None
        heads = [(heap[0], heap) for group, heap in self._heaps.items() if heap and not full(group)]
        return min(heads, key=lambda head: head[0])[1] if heads else None

    def take(self, heap: list[Waiter[T, R]], now: float) -> Waiter[T, R] | None:
        while heap:
            waiter = heapq.heappop(heap)
            self.ledger.discard(waiter.key, waiter.seq)
            if waiter.future.done():
                continue
            if waiter.due <= now or (self._early_expiry and hopeless(waiter, now, self._lead)):
                waiter.future.set_exception(self._expired(waiter.item))
                continue
            return waiter
        return None

    def waiting(self) -> Iterator[Waiter[T, R]]:
        return itertools.chain(*self._heaps.values())

    def clear(self) -> list[Waiter[T, R]]:
        waited = list(self.waiting())
        for heap in self._heaps.values():
            heap.clear()
        self.ledger.clear()
        return waited
