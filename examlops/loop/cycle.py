"""One turn of the loop after a retrain was asked for: drop it, roll back, or retrain and analyse.

``retrain_cycle(parts, model, ...)``:

- ``from_trigger`` (the bridges' failure trigger asked): ``trigger.on_trigger`` decides. A model a live run
  holds: the request is dropped (``loop.trigger_dropped`` names the run that holds it). Within the grace
  period of the loop's promotion: ``trigger.rollback_promotion``;
- an operator's retrain of a model a live run holds is refused (``Conflict``);
- otherwise the model is held in ``retraining`` while ``retrain()`` runs. A candidate that is not better than
  Production was registered but not moved to Canary: ``loop.candidate_kept_back``, the loop ends in
  ``serving``. A candidate on Canary goes on to ``analyse()`` (the canary analysis, which takes over the
  hold as the same owner) unless ``analyse`` is None (``LoopSettings.auto_canary`` off): then the loop
  ends in ``serving`` and says how to start the analysis.

An error from ``retrain()`` ends the hold in ``serving`` with the error as its note and propagates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from examlops.core.errors import Conflict
from examlops.loop import events
from examlops.loop.analysis import LoopParts
from examlops.loop.ports import Promotion
from examlops.loop.recovery import end_dead_run
from examlops.loop.state import Phase
from examlops.loop.trigger import on_trigger, rollback_promotion

Action = Literal["dropped", "rolled_back", "kept_back", "on_canary", "analysed"]


class Candidate(Protocol):
    """What the cycle reads of a retrain's result (``registry.retrain.RetrainResult``)."""

    @property
    def version(self) -> str: ...

    @property
    def alias(self) -> str: ...

    @property
    def moved(self) -> bool: ...

    @property
    def candidate_rmse(self) -> float: ...

    @property
    def production_rmse(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class CycleResult:
    model: str
    action: Action
    note: str
    candidate: Candidate | None = None
    analysis: Any = None
    rollback: Promotion | None = None


def retrain_cycle(
    parts: LoopParts,
    model: str,
    *,
    owner: str,
    run: str,
    from_trigger: bool,
    retrain: Callable[[], Candidate],
    analyse: Callable[[], Any] | None,
    reason: str = "",
) -> CycleResult:
    """Drop, roll back, or retrain and analyse (module docstring)."""
    end_dead_run(parts, model)  # a dead run's split is not the site's own
    p, now = parts, parts.clock()
    decision = on_trigger(p.store, model, now, p.settings)
    if decision.action == "busy":
        if not from_trigger:
            raise Conflict(f"{model}: {decision.reason}; try again when it has ended (`exa loop status`)")
        return _dropped(parts, model, decision.reason, reason, run)
    if decision.action == "rollback" and from_trigger:
        promotion = rollback_promotion(parts, model, owner=owner, run=run, reason=f"{decision.reason} ({reason})")
        return CycleResult(model, "rolled_back", f"rolled back to version {promotion.new_version}", rollback=promotion)
    held = p.store.claim(model, owner, Phase.RETRAINING, now, p.settings.lease_s, run=run, started_at=now,
                         figures={}, share=0, note=f"retraining: {reason}"[:500])  # fmt: skip
    if held is None:
        return _dropped(parts, model, "another run took the model first", reason, run)
    try:
        candidate = retrain()
    except BaseException as exc:
        p.store.finish(model, owner, Phase.SERVING, p.clock(), note=f"the retrain failed: {exc}"[:500])
        raise
    if not candidate.moved:
        note = (
            f"version {candidate.version} (RMSE {candidate.candidate_rmse:.4f}) is not better than Production "
            f"(RMSE {candidate.production_rmse:.4f}); {candidate.alias} was not moved"
        )
        p.audit(events.CANDIDATE_KEPT_BACK, model, {"version": candidate.version, "run": run, "note": note,
                "candidate_rmse": candidate.candidate_rmse, "production_rmse": candidate.production_rmse})  # fmt: skip
        p.store.finish(model, owner, Phase.SERVING, p.clock(), note=note)
        p.say(f"{model}: {note}")
        return CycleResult(model, "kept_back", note, candidate)
    if analyse is None or candidate.alias != "Canary":
        note = f"{candidate.alias} -> version {candidate.version}; start its analysis with `exa canary start {model}`"
        p.store.finish(model, owner, Phase.SERVING, p.clock(), note=note, canary_version=candidate.version)
        return CycleResult(model, "on_canary", note, candidate)
    p.store.update(model, owner, p.clock(), canary_version=candidate.version,
                   note=f"Canary -> version {candidate.version}; starting the canary analysis")  # fmt: skip
    analysis = analyse()
    return CycleResult(model, "analysed", f"canary analysis of version {candidate.version} ended", candidate, analysis)


def _dropped(parts: LoopParts, model: str, why: str, reason: str, run: str) -> CycleResult:
    note = f"retrain request dropped: {why}"
    parts.audit(events.TRIGGER_DROPPED, model, {"why": why, "reason": reason, "run": run})
    parts.say(f"{model}: {note}")
    return CycleResult(model, "dropped", note)
