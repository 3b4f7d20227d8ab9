"""The ports the closed loop acts through, and ``LoopParts`` that holds them; ``bootstrap.loop`` builds their
adapters.

Every method may raise ``StoreUnavailable`` / ``RegistryUnavailable`` (a dependency is down) and the
promotion errors (``PromotionIncomplete`` names the instances that did not follow).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from examlops.core.settings import LoopSettings
from examlops.loop.figures import CallSample
from examlops.loop.state import LoopStore

AuditHook = Callable[[str, str, Mapping[str, Any]], None]


@dataclass(frozen=True, slots=True)
class Promotion:
    """An alias move every serving instance followed."""

    model: str
    old_version: str | None
    new_version: str
    instances: tuple[str, ...]


class Versions(Protocol):
    def version(self, model: str, alias: str) -> str:
        """The version ``alias`` points at in the registry; ``AliasNotFound`` when it points nowhere."""


class TrafficSplit(Protocol):
    def get(self, model: str) -> dict[str, int]:
        """The stored split of the default alias's traffic (empty: all to the default alias)."""

    def set(self, model: str, weights: Mapping[str, int]) -> None:
        """Record the change on the audit trail, then store the split (empty clears it); serving applies it within
        ``settle_s``. When the record cannot be written nothing is stored (``StoreUnavailable``)."""

    @property
    def settle_s(self) -> float:
        """Seconds until every serving instance applies a stored split (their rules cache)."""


class CallSource(Protocol):
    def calls(self, model: str, since: float) -> list[CallSample]:
        """Every traced call of ``model`` (catalog name) that arrived at or after ``since``."""


class PredictionSource(Protocol):
    def predictions(self, model: str, since: float) -> Mapping[str, Sequence[float]]:
        """The predictions each version answered on the bus since ``since`` (UNIX seconds), by version."""


DriftTest = Callable[[Sequence[float], Sequence[float]], tuple[float, float]]
"""``(Canary's predictions, Production's)`` -> the two-sample K-S p-value and distance."""


class Promoter(Protocol):
    def promote(self, model: str, version: str, *, production: str) -> Promotion:
        """Point Production at ``version`` (the Canary version analysed) and make every serving instance serve
        it; ``Conflict`` (nothing moved) when Production no longer points at ``production``."""

    def rollback(self, model: str, *, production: str) -> Promotion:
        """Point Production back at the version its last promotion replaced, on every instance; ``Conflict``
        (nothing moved) when Production no longer points at ``production``."""

    def load(self, model: str, alias: str, version: str) -> tuple[str, ...]:
        """Make every serving instance load and serve ``version`` for ``alias`` (the registry already points
        there); the instances that confirmed. ``PromotionIncomplete`` when one did not."""


class FailureWindows(Protocol):
    def reset(self, model: str, *, cooldown: bool) -> None:
        """Empty the model's failure window (and its retrain cooldown with ``cooldown``): a new Production
        is not judged by the failures of the version it replaced."""


@dataclass
class LoopParts:
    """What the loop acts through (``bootstrap.loop`` builds them), its settings, and its clock."""

    store: LoopStore
    versions: Versions
    traffic: TrafficSplit
    calls: CallSource
    predictions: PredictionSource
    drift: DriftTest
    promoter: Promoter
    failures: FailureWindows
    audit: AuditHook
    settings: LoopSettings
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    say: Callable[[str], None] = field(default=lambda _message: None)
