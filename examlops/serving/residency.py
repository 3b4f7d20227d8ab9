"""Model versions resident in the predict runtime, reference-counted (the hot set's lower half).

Contract: a version is loaded into the runtime once (key ``"{name}/{version}"``) however many
aliases, pinned slots and requests in flight use it, and unloaded when the last of them lets go.
Blocking registry calls (``source.fetch``) run in a thread; a load never overlaps an unload of its
key, and a load that every taker gave up on is unloaded once it ends.

Failure mode: ``take`` raises ``ModelLoadError`` (and drops its reference) for a missing artifact,
a file that does not load, any exception while loading, and a model that declares a number of input
columns (``n_features_in_``) other than the catalog's row; a refused key is unloaded again. A failed
unload is logged, never raised.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from examlops.core.errors import ExamlopsError, ModelLoadError
from examlops.core.messages import ModelRef
from examlops.serving.ports import ModelSource, PredictRuntime

log = logging.getLogger(__name__)

EntryState = Literal["ready", "degraded", "error", "missing"]


def runtime_key(ref: ModelRef) -> str:
    return f"{ref.name}/{ref.version}"


def describe(exc: BaseException) -> str:
    """An error in a few words for a state's reason: our errors speak for themselves, others get their type."""
    return str(exc) if isinstance(exc, ExamlopsError) else f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True, slots=True)
class Entry:
    """A loaded version as a request sees it; ``alias`` is None for a pinned version."""

    ref: ModelRef
    key: str
    alias: str | None
    loaded_at: float
    state: EntryState = "ready"


class Residency:
    """Reference-counted keys in the runtime: loaded once, unloaded when the last reference goes.

    ``width(ref)`` is the number of input columns the catalog gives ``ref``'s model.
    """

    def __init__(self, source: ModelSource, runtime: PredictRuntime, width: Callable[[ModelRef], int]) -> None:
        self._source = source
        self._runtime = runtime
        self._width = width
        self.refs: dict[str, int] = {}
        self._loaded: set[str] = set()
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._unloading: dict[str, asyncio.Task[None]] = {}

    async def take(self, ref: ModelRef) -> str:
        """One more reference to ``ref``'s key, loading it first if needed (``ModelLoadError`` and co.)."""
        key = runtime_key(ref)
        self.refs[key] = self.refs.get(key, 0) + 1
        try:
            if key not in self._loaded:
                task = self._loading.get(key)
                if task is None:
                    task = self._loading[key] = asyncio.get_running_loop().create_task(self._load(key, ref))
                # shield: a waiter that gives up must not cancel a load other waiters share.
                await asyncio.shield(task)
        except BaseException:
            self.drop(key)
            raise
        return key

    def hold(self, key: str) -> None:
        """One more reference to a key that is loaded and referenced already."""
        self.refs[key] += 1

    def drop(self, key: str) -> None:
        left = self.refs.get(key, 0) - 1
        if left > 0:
            self.refs[key] = left
            return
        self.refs.pop(key, None)
        if key in self._loaded:
            self._loaded.discard(key)
            self._unloading[key] = asyncio.get_running_loop().create_task(self._unload(key))

    async def _load(self, key: str, ref: ModelRef) -> None:
        try:
            if (pending := self._unloading.get(key)) is not None:
                await pending
            try:
                location = await asyncio.to_thread(self._source.fetch, ref)
                declared = await self._runtime.load(key, location)
                if declared is not None and declared != (expected := self._width(ref)):
                    await self._runtime.unload(key)
                    raise ModelLoadError(
                        f"{key} takes {declared} input columns, the catalog gives {expected} "
                        f"({expected - 1} embedding values and the node count)"
                    )
            except ExamlopsError:
                raise
            except Exception as exc:
                raise ModelLoadError(f"{key} could not be loaded: {describe(exc)}") from exc
            self._loaded.add(key)
            if key not in self.refs:  # every taker gave up while it loaded
                self.refs[key] = 1
                self.drop(key)
        finally:
            self._loading.pop(key, None)

    async def _unload(self, key: str) -> None:
        try:
            await self._runtime.unload(key)
        except Exception:
            log.exception("unloading %s failed", key)
        finally:
            if self._unloading.get(key) is asyncio.current_task():
                del self._unloading[key]

    async def settle(self) -> None:
        """Wait for every load and unload in progress."""
        while pending := [*self._loading.values(), *self._unloading.values()]:
            await asyncio.gather(*pending, return_exceptions=True)
