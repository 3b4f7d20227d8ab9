"""The hot set: the model versions held in the predict runtime, by alias and by pinned version.

Contracts:

- ``load_all`` resolves, for every catalog model, every configured alias that exists (Production,
  Canary, Staging, plus the model's default alias) and loads its version. One model or alias failing
  does not stop the others: it is recorded with state ``error`` and the reason; an alias the registry
  does not have is ``missing``. ``load_model`` retries one model's aliases that are not loaded;
  ``unloaded_models`` names the models to retry (a failed load of any alias, or a default alias not held),
  but not for a version of a non-default alias that failed ``LOAD_TRIES`` loads for reasons not ``retryable``.
- Versions are loaded once and unloaded when the last user lets go (``residency.Residency``);
  pinned versions live in an LRU of ``version_cache_size`` (``pinned.PinnedVersions``).
- ``get`` / ``acquire`` answer by alias (case-insensitive; the default alias when none is named) or by
  raw version. ``acquire`` also holds the version until ``release``, so a request in flight finishes
  on the version it started with even if a reload swaps its alias meanwhile.
- ``reload`` asks the registry where each alias points now; for an alias that moved it loads the new
  version first, then swaps, then releases the old one. A new version that fails to load (see
  ``residency``) is refused: the old one keeps serving, marked ``degraded`` with the reason, and the
  refusal is logged with model, alias, version and reason. An unreachable registry changes nothing
  but marks the model's entries stale (in ``reason``, with the time of the first failed reload),
  until a reload reaches it again.

Errors: ``ModelNotFound``, ``AliasNotFound`` (the model does not have or serve that alias), ``VersionNotFound``,
``NotReady`` (the alias exists but its load failed), ``ModelLoadError``, ``RegistryUnavailable`` (pinned only).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from examlops.core.errors import AliasNotFound, ExamlopsError, NotReady
from examlops.core.messages import KNOWN_ALIASES, ModelRef, canonical_alias
from examlops.registry.catalog import Catalog, ModelSpec
from examlops.serving.pinned import PinnedVersions
from examlops.serving.ports import ModelSource, PredictRuntime
from examlops.serving.residency import Entry, EntryState, Residency, describe

log = logging.getLogger(__name__)

NOT_LOADED = "not loaded yet"
LOAD_TRIES = 4  # a version that fails for its own reasons: the first load and three retries


@dataclass(frozen=True, slots=True)
class EntryInfo:
    """One row of ``GET /v1/models``."""

    model: str
    alias: str | None
    version: str | None
    run_id: str | None
    loaded_at: float | None
    state: EntryState
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class ReloadChange:
    """What a reload did to one alias: ``swapped``, ``loaded``, ``removed``, ``refused`` or ``unreachable``."""

    model: str
    alias: str
    old_version: str | None
    new_version: str | None
    outcome: Literal["swapped", "loaded", "removed", "refused", "unreachable"]
    reason: str | None = None


@dataclass(slots=True)
class _Slot:
    model: str
    alias: str
    default: bool  # the model's default alias: retried without limit, as the service is not ready without it
    entry: Entry | None = None
    state: EntryState = "missing"
    reason: str | None = NOT_LOADED
    stale: str | None = None
    stale_since: float | None = None
    failed: tuple[str, int] | None = None  # (version, its loads that failed for its own reasons)
    given_up: bool = False  # on ``failed``'s version: LOAD_TRIES loads failed, left to reloads

    @property
    def due(self) -> bool:
        """Worth a background retry: not held, the default alias or a failed load, not given up on."""
        return self.entry is None and (self.default or self.state == "error") and not self.given_up

    def count_failure(self, version: str, exc: Exception) -> None:
        """Count a failed load of ``version`` unless ``exc`` is retryable; log once when retries stop."""
        if self.default or (isinstance(exc, ExamlopsError) and exc.retryable):
            return  # the default alias, or a registry, worker or deadline that may pass: retried without limit
        tries = self.failed[1] + 1 if self.failed is not None and self.failed[0] == version else 1
        self.failed, self.given_up = (version, tries), tries >= LOAD_TRIES
        if tries == LOAD_TRIES:
            log.warning("%s@%s: version %s failed %d loads; left to reloads", self.model, self.alias, version, tries)


class HotSet:
    """The versions in memory, by model and alias, plus an LRU of pinned versions (contracts above)."""

    def __init__(
        self,
        catalog: Catalog,
        source: ModelSource,
        runtime: PredictRuntime,
        *,
        aliases: Sequence[str] = KNOWN_ALIASES,
        version_cache_size: int = 8,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._catalog = catalog
        self._source = source
        # Rows are the embedding then the node count (``features.validate_features``).
        self._residency = Residency(source, runtime, lambda ref: catalog.get(ref.name).embedding_dim + 1)
        self._pinned = PinnedVersions(source, self._residency, version_cache_size, clock)
        self._clock = clock
        self._slots: dict[str, list[_Slot]] = {}
        for spec in catalog:
            names = [canonical_alias(alias) for alias in aliases]
            if spec.default_alias_canonical.lower() not in {name.lower() for name in names}:
                names.insert(0, spec.default_alias_canonical)
            default = spec.default_alias_canonical.lower()
            self._slots[spec.name.lower()] = [_Slot(spec.name, name, name.lower() == default) for name in names]
        self._locks: dict[str, asyncio.Lock] = {}

    async def load_all(self) -> None:
        """Load every model's existing aliases; never raises for one model's failure."""
        await asyncio.gather(*(self.load_model(spec.name) for spec in self._catalog))

    async def load_model(self, model: str) -> None:
        """Load the aliases of one model that are not loaded yet; failures are recorded, not raised."""
        spec, slots = self._model(model)
        async with self._lock(spec):
            todo = [slot for slot in slots if slot.entry is None and not slot.given_up]
            if not todo:
                return
            try:
                refs = await self._aliases(spec)
            except Exception as exc:
                for slot in todo:
                    slot.state, slot.reason = "error", f"registry: {describe(exc)}"
                return
            await asyncio.gather(*(self._follow(slot, refs.get(slot.alias.lower())) for slot in todo))

    async def get(self, model: str, alias: str | None = None, version: str | None = None) -> Entry:
        """The entry that answers (model, alias or version) now; errors in the module docstring."""
        return await self._entry(model, alias, version, hold=False)

    async def acquire(self, model: str, alias: str | None = None, version: str | None = None) -> Entry:
        """Like ``get``, and the version stays loaded until ``release(entry)``."""
        return await self._entry(model, alias, version, hold=True)

    def release(self, entry: Entry) -> None:
        self._residency.drop(entry.key)

    def available_aliases(self, model: str) -> set[str]:
        """The canonical aliases of a model that can answer now (ready or degraded)."""
        return {slot.alias for slot in self._model(model)[1] if slot.entry is not None}

    def missing_defaults(self) -> list[str]:
        """Catalog models whose default alias is not loaded."""
        return [
            spec.name for spec in self._catalog if spec.default_alias_canonical not in self.available_aliases(spec.name)
        ]

    def unloaded_models(self) -> list[str]:
        """Catalog models with an alias worth retrying: a failed load or a default alias not held (contract above)."""
        return [spec.name for spec in self._catalog if any(slot.due for slot in self._model(spec.name)[1])]

    def entries(self) -> list[EntryInfo]:
        """Every configured alias of every model (loaded or not, with why), then the pinned versions."""
        infos: list[EntryInfo] = []
        for slots in list(self._slots.values()):  # copies: metrics may read this from another thread
            for slot in list(slots):
                entry, reason = slot.entry, "; ".join(r for r in (slot.reason, slot.stale) if r) or None
                version, run_id, loaded_at = (
                    (entry.ref.version, entry.ref.run_id, entry.loaded_at) if entry else (None,) * 3
                )
                infos.append(EntryInfo(slot.model, slot.alias, version, run_id, loaded_at, slot.state, reason))
        for entry in self._pinned.entries():
            infos.append(EntryInfo(entry.ref.name, None, entry.ref.version, entry.ref.run_id, entry.loaded_at, "ready"))
        return infos

    async def reload(self, model: str | None = None) -> list[ReloadChange]:
        """Follow the registry's aliases for one model (all when None); returns what changed."""
        specs = [self._catalog.get(model)] if model is not None else list(self._catalog)
        done = await asyncio.gather(*(self._reload_model(spec) for spec in specs))
        return [change for changes in done for change in changes]

    async def settle(self) -> None:
        """Wait for loads and unloads in progress (unloads run behind the request that let go)."""
        await self._residency.settle()

    async def close(self) -> None:
        """Settle; the runtime itself, and unloading everything, belongs to whoever built it."""
        await self.settle()

    def _model(self, model: str) -> tuple[ModelSpec, list[_Slot]]:
        spec = self._catalog.get(model)
        return spec, self._slots[spec.name.lower()]

    def _lock(self, spec: ModelSpec) -> asyncio.Lock:
        # Created on first use, on the running loop; serialises loads and reloads of one model.
        return self._locks.setdefault(spec.name.lower(), asyncio.Lock())

    async def _aliases(self, spec: ModelSpec) -> dict[str, ModelRef]:
        refs = await asyncio.to_thread(self._source.aliases, spec.name)
        return {alias.lower(): ref for alias, ref in refs.items()}

    async def _entry(self, model: str, alias: str | None, version: str | None, *, hold: bool) -> Entry:
        spec, slots = self._model(model)
        if version is not None:
            version = str(version).strip()
            # A version an alias already serves needs no trip to the registry.
            known = next((s.entry.ref for s in slots if s.entry is not None and s.entry.ref.version == version), None)
            return await self._pinned.entry(spec.name, version, known, hold=hold)
        wanted = spec.default_alias_canonical if alias is None else alias.strip()
        slot = next((slot for slot in slots if slot.alias.lower() == wanted.lower()), None)
        if slot is None:
            served = ", ".join(slot.alias for slot in slots)
            raise AliasNotFound(f"{spec.name} does not serve the alias {wanted[:40]!r} (served: {served})")
        if slot.entry is None:
            if slot.state == "missing" and slot.reason != NOT_LOADED:
                raise AliasNotFound(f"{spec.name} has no alias {slot.alias} in the registry")
            raise NotReady(f"{spec.name}@{slot.alias} is not loaded: {slot.reason}")
        if hold:
            self._residency.hold(slot.entry.key)
        return slot.entry

    async def _reload_model(self, spec: ModelSpec) -> list[ReloadChange]:
        slots = self._slots[spec.name.lower()]
        async with self._lock(spec):
            try:
                refs = await self._aliases(spec)
            except Exception as exc:
                now = self._clock()
                for slot in slots:
                    slot.stale_since = slot.stale_since or now
                    since = datetime.fromtimestamp(slot.stale_since, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                    slot.stale = f"stale since {since}: the registry was unreachable at reload ({describe(exc)})"
                stale = slots[0].stale if slots else None
                return [
                    ReloadChange(spec.name, s.alias, s.entry.ref.version, None, "unreachable", stale)
                    for s in slots
                    if s.entry is not None
                ]
            changes: list[ReloadChange] = []
            for slot in slots:
                slot.stale, slot.stale_since = None, None
                change = await self._follow(slot, refs.get(slot.alias.lower()))
                if change is not None:
                    changes.append(change)
            return changes

    async def _follow(self, slot: _Slot, ref: ModelRef | None) -> ReloadChange | None:
        """Point one slot at ``ref``: load first, swap, then release the old version."""
        old = slot.entry
        old_version = old.ref.version if old is not None else None
        if ref is None:
            slot.state, slot.reason = "missing", "the registry has no such alias"
            if old is None:
                return None
            slot.entry = None
            self._residency.drop(old.key)
            return ReloadChange(slot.model, slot.alias, old_version, None, "removed")
        if old is not None and old.ref.version == ref.version:
            if slot.state == "degraded":  # the registry went back to the version that serves
                slot.entry, slot.state, slot.reason = dataclasses.replace(old, state="ready"), "ready", None
            return None
        try:
            key = await self._residency.take(ref)
        except Exception as exc:
            reason = f"version {ref.version} refused: {describe(exc)}"
            log.warning(
                "refused a new version: model=%s alias=%s version=%s serving=%s reason=%s",
                slot.model,
                slot.alias,
                ref.version,
                old_version or "nothing",
                reason,
            )
            if old is not None:
                slot.entry, slot.state = dataclasses.replace(old, state="degraded"), "degraded"
            else:
                slot.state = "error"
            slot.reason = reason
            slot.count_failure(ref.version, exc)
            return ReloadChange(slot.model, slot.alias, old_version, ref.version, "refused", reason)
        slot.entry, slot.state, slot.reason = Entry(ref, key, slot.alias, self._clock()), "ready", None
        slot.failed, slot.given_up = None, False
        if old is not None:
            self._residency.drop(old.key)
        return ReloadChange(slot.model, slot.alias, old_version, ref.version, "swapped" if old else "loaded")
