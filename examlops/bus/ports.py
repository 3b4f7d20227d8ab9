"""What the bus needs from the rest of the platform: identities' bus keys and the task map.

The bridge verifies each job with the bus key of the identity it names (``BusKeys``) and serves each
task's bus address beside the model addresses (``TaskAddresses``). Both are read on the bridge's event
loop, so an implementation answers from memory in the common case (a cache refreshed within
``settings.traffic.rules_ttl_s``); a miss may read its store. Either raises ``StoreUnavailable`` when the
store cannot be read: the job then stays pending and is reclaimed, never refused for it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Protocol


class BusCaller(Protocol):
    """The identity a job acts as."""

    @property
    def name(self) -> str:
        """The identity's name: recorded with the job and sent to serving as ``X-Examlops-Identity``."""
        ...

    @property
    def revoked(self) -> bool:
        """True once the identity is revoked or this key is past its end: its jobs get ``unauthenticated``."""
        ...

    def may_call(self, *, task: str | None = None, model: str | None = None) -> None:
        """Return when the identity may call ``task`` and ``model`` (a task's address names both: the task and
        the model it maps to; a model's address only the model); else raise an ``ExamlopsError`` whose code is
        ``forbidden``, naming what it lacks."""
        ...


class BusKeys(Protocol):
    """Key ids to identities and their bus keys (HMAC-SHA256 of the token's secret and ``examlops-bus-v1``)."""

    def bus_key(self, key_id: str) -> tuple[BusCaller, bytes] | None:
        """``(caller, bus key)`` of a key id, or None when no identity has it. A revoked identity's key is
        still given (with ``caller.revoked`` True), so its signed jobs are told ``unauthenticated`` instead
        of silence; a revocation shows within the implementation's cache TTL. May read a store: blocking."""
        ...

    def is_cached(self, key_id: str) -> bool:
        """Whether ``bus_key(key_id)`` answers from memory; the bridge calls it in a thread otherwise."""
        ...


class TaskAddress(Protocol):
    """One task's place in the task map, as the bridge needs it."""

    @property
    def task(self) -> str: ...

    @property
    def model(self) -> str:
        """The catalog model that answers the task now (its input schema checks the job)."""
        ...

    @property
    def alias(self) -> str: ...

    @property
    def address(self) -> uuid.UUID:
        """The task's bus address: kept across remaps, so callers never follow the model."""
        ...

    @property
    def budget_ms(self) -> float | None:
        """The task's default budget (milliseconds): a job to the task that declares none gets it."""
        ...


class TaskAddresses(Protocol):
    """The task map, read whole: the bridge refreshes its copy within ``settings.traffic.rules_ttl_s``."""

    def routes(self) -> Sequence[TaskAddress]:
        """Every mapped task with its model, alias, bus address and default budget."""
        ...
