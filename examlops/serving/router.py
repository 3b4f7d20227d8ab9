"""The model router: which alias answers a request (seed 000, step 6).

Contract of ``Router.choose``:

- A request with no alias, or addressed to the model's default alias (Production), gets the model's
  traffic split: one alias of the split is drawn by weighted random choice among those that are
  available now. An alias that disappeared after the split was set simply drops out, so its share goes
  to the remaining ones; when none of the split is available, or there is no split, the default alias.
- A request pinned to any other alias gets that alias (canonical spelling), available or not: the hot
  set then says whether it exists.
- Model and alias names match case-insensitively: a split set for JPCP applies to ``jpcp``.

Splits are read from the ``TrafficRuleStore`` port and cached per model for ``ttl_s`` seconds of the
injected clock; ``set_rules`` (and ``invalidate``) drop this process's cache entry at once, other
replicas see a change within ``ttl_s``. When the store cannot be read the last known split keeps
applying (no split at all if none was ever read) and the store is asked again after ``ttl_s``:
routing never fails because SQL is down.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Collection, Iterable, Mapping

from examlops.core.errors import InvalidInput
from examlops.core.messages import KNOWN_ALIASES, canonical_alias
from examlops.registry.catalog import ModelSpec
from examlops.serving.ports import TrafficRuleStore

log = logging.getLogger(__name__)


def validate_split(weights: Mapping[str, int], available: Collection[str]) -> dict[str, int]:
    """A split ready to store: canonical alias names -> whole percentages that sum to 100.

    An empty mapping is valid (it clears the split). Refused with ``InvalidInput(field="weights")``: an
    alias the model does not have now, an alias named twice (in any spelling), a weight that is not a
    whole number or is negative, weights that do not sum to 100.
    """
    lookup = {alias.lower(): alias for alias in available}
    split: dict[str, int] = {}
    for raw, weight in weights.items():
        name = raw.strip()
        alias = lookup.get(name.lower())
        if alias is None:
            known = ", ".join(sorted(available)) or "none"
            raise InvalidInput(
                f"alias {name[:40]!r} does not exist for this model (available: {known})", field="weights"
            )
        if alias in split:
            raise InvalidInput(f"alias {alias} is named twice", field="weights")
        if isinstance(weight, bool) or not isinstance(weight, int):
            raise InvalidInput(f"the weight of {alias} must be a whole number", field="weights")
        if weight < 0:
            raise InvalidInput(f"the weight of {alias} must not be negative", field="weights")
        split[alias] = weight
    if split and sum(split.values()) != 100:
        raise InvalidInput(f"weights must add up to 100, not {sum(split.values())}", field="weights")
    return split


class Router:
    """Picks the alias of each request from cached traffic splits (contract above)."""

    def __init__(
        self,
        rules: TrafficRuleStore,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self._rules = rules
        self._ttl_s = ttl_s
        self._clock = clock
        self._rng = rng or random.Random()
        self._cache: dict[str, tuple[float, dict[str, int]]] = {}
        self._refreshing: dict[str, asyncio.Task[dict[str, int]]] = {}

    def choose(self, spec: ModelSpec, requested_alias: str | None, available: Collection[str]) -> str:
        """The canonical alias that answers this request (never raises)."""
        default = spec.default_alias_canonical
        known = (*KNOWN_ALIASES, *available)
        if requested_alias is not None and requested_alias.strip().lower() != default.lower():
            return canonical_alias(requested_alias, known)
        present = {alias.lower(): alias for alias in available}
        names: list[str] = []
        weights: list[int] = []
        for alias, weight in self.split(spec.name).items():
            if weight > 0 and alias.lower() in present:
                names.append(present[alias.lower()])
                weights.append(weight)
        if not names:
            return default
        return names[0] if len(names) == 1 else self._rng.choices(names, weights)[0]

    def split(self, model: str) -> dict[str, int]:
        """The model's split, from the cache while fresh; otherwise read now (blocking)."""
        cached = self._cache.get(model.lower())
        if cached is not None and cached[0] > self._clock():
            return cached[1]
        return self.refresh(model)

    def is_fresh(self, model: str) -> bool:
        cached = self._cache.get(model.lower())
        return cached is not None and cached[0] > self._clock()

    def read(self, model: str) -> dict[str, int]:
        """The model's split straight from the store (blocking); ``StoreUnavailable`` passes through."""
        split = {canonical_alias(alias): weight for alias, weight in self._rules.get(model).items()}
        self._cache[model.lower()] = (self._clock() + self._ttl_s, split)
        return split

    def refresh(self, model: str) -> dict[str, int]:
        """Read the model's split from the store (blocking) and cache it; on failure keep the last one."""
        key = model.lower()
        try:
            split = self.read(model)
        except Exception as exc:
            previous = self._cache.get(key)
            split = previous[1] if previous is not None else {}
            log.warning("traffic rules of %s unreadable, keeping %s: %r", model, split or "no split", exc)
        self._cache[key] = (self._clock() + self._ttl_s, split)
        return split

    async def refresh_stale(self, models: Iterable[str]) -> None:
        """Refresh every stale model off the event loop; concurrent callers share one read per model."""
        waits: list[asyncio.Task[dict[str, int]]] = []
        for model in models:
            if self.is_fresh(model):
                continue
            task = self._refreshing.get(model.lower())
            if task is None:
                task = asyncio.get_running_loop().create_task(asyncio.to_thread(self.refresh, model))
                self._refreshing[model.lower()] = task
                task.add_done_callback(self._refreshed)
            waits.append(task)
        if waits:
            # wait, not gather: a cancelled caller must not cancel a read that other batches share.
            await asyncio.wait(waits)

    def _refreshed(self, task: asyncio.Task[dict[str, int]]) -> None:
        for key, pending in list(self._refreshing.items()):
            if pending is task:
                del self._refreshing[key]

    def invalidate(self, model: str | None = None) -> None:
        """Forget the cached split of one model (all models when None) in this process."""
        if model is None:
            self._cache.clear()
        else:
            self._cache.pop(model.lower(), None)

    def set_rules(self, model: str, weights: Mapping[str, int]) -> None:
        """Store a split as given (validate it first with ``validate_split``) and drop the cached one."""
        self._rules.set(model, dict(weights))
        self.invalidate(model)
