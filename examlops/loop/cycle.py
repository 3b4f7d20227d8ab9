"""One turn of the loop after a retrain was asked for: drop it, roll back, or retrain and analyse.

``retrain_cycle(parts, model, ...)``:

- ``from_trigger`` (the bridges' failure trigger asked): ``trigger.on_trigger`` decides. A model a live run
  holds, or a promoted version that is not the one failing: the request is dropped
  (``loop.trigger_dropped`` says why). The promoted version failing within the grace period:
  ``trigger.rollback_promotion``;
- an operator's retrain of a model a live run holds is refused (``Conflict``);
- otherwise the model is held in ``retraining`` while ``retrain()`` runs. A candidate that is not better than
  Production was registered but not moved to Canary: ``loop.candidate_kept_back``, the loop ends in
  ``serving``. A candidate on Canary goes on to ``analyse()`` (the canary analysis, which takes over the
  hold as the same owner) unless ``analyse`` is None (``LoopSettings.auto_canary`` off): then the loop
  ends in ``serving`` and says how to start the analysis. An abort asked for during the retrain ends the
  loop there (``aborted``). The hold is renewed while the retrain runs.

An error from ``retrain()``, or from ``analyse()`` before it took the hold over, ends the hold in
``serving`` with the error as its note and propagates.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from examlops.core.errors import Conflict
from examlops.loop import events
from examlops.loop.ports import LoopParts, Promotion
from examlops.loop.recovery import end_dead_run
from examlops.loop.state import Phase
from examlops.loop.trigger import on_trigger, rollback_promotion

Action = Literal["dropped", "rolled_back", "kept_back", "on_canary", "analysed", "aborted"]


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
    requested_at: float | None = None,
) -> CycleResult:
    """Drop, roll back, or retrain and analyse (module docstring)."""
    end_dead_run(parts, model)  # a dead run's split is not the site's own
    p = parts
    if from_trigger:
        decision = on_trigger(parts, model, requested_at)
        if decision.action == "busy":
            return _dropped(parts, model, decision.reason, reason, run)
        if decision.action == "rollback" and decision.record is not None:
            promotion = rollback_promotion(parts, decision.record, owner=owner, run=run,
                                           reason=f"{decision.reason} ({reason})")  # fmt: skip
            note = f"rolled back to version {promotion.new_version}"
            return CycleResult(model, "rolled_back", note, rollback=promotion)
    held = p.store.claim(model, owner, Phase.RETRAINING, p.clock(), p.settings.lease_s, run=run,
                         started_at=p.clock(), figures={}, share=0, note=f"retraining: {reason}"[:500])  # fmt: skip
    if held is None:
        holder = p.store.get(model)
        why = f"a loop holds {model} ({holder.phase.value}, run {holder.run})" if holder else "another run holds it"
        if not from_trigger:
            raise Conflict(f"{model}: {why}; try again when it has ended (`exa loop status`)")
        return _dropped(parts, model, why, reason, run)
    try:
        with _renewing(parts, model, owner):
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
    record = p.store.update(model, owner, p.clock(), canary_version=candidate.version,
                            note=f"Canary -> version {candidate.version}; starting the canary analysis")  # fmt: skip
    if record is not None and record.abort_requested:
        note = f"Canary -> version {candidate.version}; its analysis was not started: an abort was asked for"
        p.store.finish(model, owner, Phase.ABORTED, p.clock(), note=note)
        return CycleResult(model, "aborted", note, candidate)
    try:
        analysis = analyse()
    except BaseException as exc:  # it failed before it took the hold over: do not leave the model held
        p.store.finish(model, owner, Phase.SERVING, p.clock(), note=f"the analysis did not start: {exc}"[:500])
        raise
    return CycleResult(model, "analysed", f"canary analysis of version {candidate.version} ended", candidate, analysis)


@contextmanager
def _renewing(parts: LoopParts, model: str, owner: str) -> Iterator[None]:
    """Renew ``owner``'s hold every third of a lease while a long step (a retrain) runs."""
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(parts.settings.lease_s / 3):
            try:
                parts.store.update(model, owner, parts.clock())
            except Exception as exc:
                parts.say(f"{model}: could not renew the loop's hold: {exc}")

    thread = threading.Thread(target=renew, name=f"examlops-loop-hold-{model}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def _dropped(parts: LoopParts, model: str, why: str, reason: str, run: str) -> CycleResult:
    note = f"retrain request dropped: {why}"
    parts.audit(events.TRIGGER_DROPPED, model, {"why": why, "reason": reason, "run": run})
    parts.say(f"{model}: {note}")
    return CycleResult(model, "dropped", note)
