"""Where each model's loop stands: ``LoopRecord``, its phases, and the ``LoopStore`` port that keeps them.

One record per model. The active phases (``retraining``, ``canary``) hold the model: ``claim`` takes it
only when no run holds it, or when the holder showed no sign of life (``updated_at``) for a lease, so one
loop runs at a time per model however many flow runs start, and a run that died does not block the model
for ever. Every other phase is where the last loop ended: ``serving`` (nothing ran yet, or the candidate was
not better), ``promoted``, ``rejected`` (Canary failed its gates; its share is 0), ``rolled_back`` (the
promoted version failed within the grace period), ``undecided`` (not enough traffic in time) and
``aborted``.

Failure mode of every store method: ``StoreUnavailable``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Protocol


class Phase(StrEnum):
    SERVING = "serving"
    RETRAINING = "retraining"
    ROLLING_BACK = "rolling_back"
    CANARY = "canary"
    PROMOTED = "promoted"
    REJECTED = "rejected"
    ROLLED_BACK = "rolled_back"
    UNDECIDED = "undecided"
    ABORTED = "aborted"

    @property
    def active(self) -> bool:
        return self in (Phase.RETRAINING, Phase.ROLLING_BACK, Phase.CANARY)


ACTIVE_PHASES = tuple(phase for phase in Phase if phase.active)


@dataclass(frozen=True, slots=True)
class LoopRecord:
    model: str
    phase: Phase
    owner: str | None = None
    """The run that holds an active phase."""
    run: str = ""
    """What runs it, for a person: a Prefect flow run id, or the command."""
    started_at: float = 0.0
    updated_at: float = 0.0
    canary_version: str | None = None
    production_version: str | None = None
    share: int = 0
    """Canary's percent of the default alias's traffic during the analysis."""
    restore: dict[str, int] = field(default_factory=dict)
    """The split before the analysis changed it (empty: none), put back when it ends."""
    figures: dict[str, Any] = field(default_factory=dict)
    """The figures so far or at the decision: per version, the drift, the gates."""
    note: str = ""
    promoted_at: float | None = None
    """When the loop last promoted this model (the grace period counts from it)."""
    replaced_version: str | None = None
    """What Production pointed at before that promotion."""
    abort_requested: bool = False

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "phase": self.phase.value}

    def held(self, now: float, lease_s: float) -> bool:
        """An active phase whose run showed a sign of life within ``lease_s``: it holds the model."""
        return self.phase.active and self.updated_at >= now - lease_s

    def stale(self, now: float, lease_s: float) -> bool:
        """An active phase whose run showed no sign of life within ``lease_s``: the next run ends it."""
        return self.phase.active and not self.held(now, lease_s)


class LoopStore(Protocol):
    def get(self, model: str) -> LoopRecord | None: ...

    def list(self) -> list[LoopRecord]: ...

    def claim(
        self, model: str, owner: str, phase: Phase, now: float, lease_s: float, **values: Any
    ) -> LoopRecord | None:
        """Put ``model`` in the active ``phase`` for ``owner`` (and set ``values``) unless another live run
        holds it: the record as written, or None when it is held (``get`` says by whom)."""

    def update(self, model: str, owner: str, now: float, **values: Any) -> LoopRecord | None:
        """Set ``values`` and renew the hold while ``owner`` holds the model; None when it no longer does."""

    def finish(self, model: str, owner: str, phase: Phase, now: float, **values: Any) -> LoopRecord | None:
        """End ``owner``'s hold with the final ``phase`` (and ``values``); None when it did not hold the model."""

    def request_abort(self, model: str, now: float) -> LoopRecord | None:
        """Ask the run that holds ``model`` to stop; the record, or None when no run holds it."""
