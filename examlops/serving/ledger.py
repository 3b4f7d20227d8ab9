"""The micro-batcher's waiting items as arrays in the order they will be taken, for the admission estimate.

``Ledger`` holds, per waiting item, its ``key`` (queue order; ties in arrival order, ``seq``), its ``due``
(loop time; ``math.inf``: none) and its tally (the model it calls, as an index into ``names``). The
batcher's queues (``serving.queues``) add an item when it is queued and discard it when it leaves the queue
(taken into a batch, or dropped), and the batcher when its caller gives up, so the ledger is the queue at
every moment the loop runs.

Contract: ``view`` gives the three arrays in queue order; the estimate reads "the calls ahead of a key"
as a prefix found by binary search and "the calls behind it" as the rest, so deciding admission costs
the same few array operations at any queue length (``bench/admission_cost.py``). Adding or discarding
is a binary search (two more among equal keys) and one shift of memory. ``discard`` of an item that is
not there does nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


class Ledger:
    """Key, due and tally of every waiting item, sorted by (key, seq); see the module docstring.

    The items live in ``[lo, hi)`` of four columns: taking the head only moves ``lo``, and an item is
    added by moving whichever side of its place is shorter.
    """

    def __init__(self, capacity: int = 256) -> None:
        self._keys: Floats = np.empty(capacity)
        self._seqs: Ints = np.empty(capacity, dtype=np.int64)
        self._dues: Floats = np.empty(capacity)
        self._tallies: Ints = np.empty(capacity, dtype=np.int64)
        self._lo = self._hi = capacity // 2
        self.names: list[str] = []
        """The tallies seen, in the order first seen: ``view``'s tallies index this list."""
        self._ids: dict[str, int] = {}

    def __len__(self) -> int:
        return self._hi - self._lo

    def tally_id(self, name: str) -> int:
        """The index of ``name`` in ``names`` (added when new)."""
        found = self._ids.get(name)
        if found is None:
            found = self._ids[name] = len(self.names)
            self.names.append(name)
        return found

    def add(self, key: float, seq: int, due: float, name: str) -> None:
        """Note a waiting item at its place in queue order."""
        if self._lo == 0 or self._hi == len(self._tallies):
            self._recentre()
        lo, hi = self._lo, self._hi
        at = self._find(key, seq)
        if at - lo < hi - at:  # fewer items before its place: move them one back
            for column in self._all():
                column[lo - 1 : at - 1] = column[lo:at]
            self._lo, at = lo - 1, at - 1
        else:
            for column in self._all():
                column[at + 1 : hi + 1] = column[at:hi]
            self._hi = hi + 1
        self._keys[at], self._seqs[at], self._dues[at] = key, seq, due
        self._tallies[at] = self.tally_id(name)

    def discard(self, key: float, seq: int) -> bool:
        """Forget the item (``key``, ``seq``); False when it is not here."""
        lo, hi = self._lo, self._hi
        at = self._find(key, seq)
        if at >= hi or self._keys[at] != key or self._seqs[at] != seq:
            return False
        if at == lo:
            self._lo = lo + 1
        else:
            for column in self._all():
                column[at : hi - 1] = column[at + 1 : hi]
            self._hi = hi - 1
        return True

    def clear(self) -> None:
        self._lo = self._hi = len(self._tallies) // 2

    def view(self) -> tuple[Floats, Floats, Ints]:
        """(keys, dues, tallies) of the waiting items in queue order: views, valid until the next change."""
        lo, hi = self._lo, self._hi
        return self._keys[lo:hi], self._dues[lo:hi], self._tallies[lo:hi]

    def _find(self, key: float, seq: int) -> int:
        """The index of (``key``, ``seq``), or where it would go: equal keys sit in ``seq`` order (arrival)."""
        lo, hi = self._lo, self._hi
        keys = self._keys[lo:hi]
        first = int(np.searchsorted(keys, key, side="left"))
        if first == hi - lo or keys[first] != key:
            return lo + first
        last = int(np.searchsorted(keys, key, side="right"))  # a run of equal keys (background work: inf)
        return lo + first + int(np.searchsorted(self._seqs[lo + first : lo + last], seq, side="left"))

    def _recentre(self) -> None:
        """Room on both sides: the items in the middle of columns at least four times their count."""
        count = len(self)
        size = max(len(self._tallies), 4 * count)
        start = (size - count) // 2
        lo, hi = self._lo, self._hi

        def moved(column: Any) -> Any:
            new = np.empty(size, dtype=column.dtype)
            new[start : start + count] = column[lo:hi]
            return new

        self._keys, self._seqs = moved(self._keys), moved(self._seqs)
        self._dues, self._tallies = moved(self._dues), moved(self._tallies)
        self._lo, self._hi = start, start + count

    def _all(self) -> tuple[Floats, Ints, Floats, Ints]:
        return self._keys, self._seqs, self._dues, self._tallies
