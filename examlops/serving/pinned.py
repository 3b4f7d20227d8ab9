"""Versions pinned by requests (``version=`` instead of an alias), kept in an LRU.

Contract: a pinned version is loaded on demand and the ``size`` most recently used stay loaded; each
holds one reference in the ``Residency``, dropped on eviction (the version unloads when nothing else
uses it). A version an alias already serves is not looked up in the registry again.

Failure mode: the registry's errors (``VersionNotFound``, ``RegistryUnavailable``) and the residency's
(``ModelLoadError``) reach the caller; nothing is cached for a version that failed.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable

from examlops.core.messages import ModelRef
from examlops.serving.ports import ModelSource
from examlops.serving.residency import Entry, Residency


class PinnedVersions:
    """An LRU of pinned entries over a ``Residency`` (contract above)."""

    def __init__(self, source: ModelSource, residency: Residency, size: int, clock: Callable[[], float]) -> None:
        self._source = source
        self._residency = residency
        self._size = size
        self._clock = clock
        self._pinned: OrderedDict[str, Entry] = OrderedDict()

    def entries(self) -> list[Entry]:
        """The pinned entries, least recently used first (a copy: metrics read it from another thread)."""
        return list(self._pinned.values())

    async def entry(self, model: str, version: str, known: ModelRef | None, *, hold: bool) -> Entry:
        """The entry of ``model`` at ``version``, loading it if needed; ``known`` skips the registry.

        With ``hold``, the caller holds one more reference until it drops the entry's key.
        """
        pin = f"{model.lower()}/{version}"
        entry = self._pinned.get(pin)
        if entry is None:
            ref = known if known is not None else await asyncio.to_thread(self._source.version, model, version)
            key = await self._residency.take(ref)  # the LRU's own reference
            entry = self._pinned.get(pin)
            if entry is None:
                entry = self._pinned[pin] = Entry(ref, key, None, self._clock())
            else:  # a concurrent request pinned it first; keep one reference only
                self._residency.drop(key)
        self._pinned.move_to_end(pin)
        if hold:
            self._residency.hold(entry.key)
        while len(self._pinned) > self._size:
            _, evicted = self._pinned.popitem(last=False)
            self._residency.drop(evicted.key)
        return entry
