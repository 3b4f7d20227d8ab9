"""What an analysis does once it ended: promote, reject, put the split back, or record an error.

``settle(parts, run, how, window)`` acts on the last ``Window``:

- **pass**: promotes the version analysed (``Promoter.promote`` with Canary's version and the Production it
  was compared with: ``Conflict`` and nothing moved when either alias moved meanwhile), records
  ``promoted`` at once (the grace period counts from now), then puts the split back and empties the
  model's failure window and cooldown. A promotion an instance did not follow is recorded ``promoted``
  (the alias moved) with the lagging instances in its note, and propagates;
- **fail**: Canary's share goes to 0, Production stays; **undecided** and **aborted**: the split goes back.

Every ending is one ``loop.decided`` event naming each gate, its figures and limit, and what was done.
``give_up(parts, run, error)`` ends a run that raised: the split goes back and the hold ends ``undecided``
with ``loop.decided`` ``error``, as far as the stores allow (a run that lost its hold touches nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from examlops.core.errors import Conflict, PromotionIncomplete
from examlops.loop import events
from examlops.loop.ports import LoopParts, Promotion
from examlops.loop.state import Phase
from examlops.loop.window import AnalysisResult, Ending, Window


@dataclass(frozen=True, slots=True)
class Run:
    """One analysis: its model, its hold, the split it found, its share, when it began and its window opened."""

    model: str
    owner: str
    restore: dict[str, int]
    share: int
    started: float
    window_start: float


def settle(parts: LoopParts, run: Run, how: str, window: Window) -> AnalysisResult:
    p = parts
    ending: Ending = "aborted" if how == "aborted" else "undecided" if how == "limit" else window.decision
    promotion: Promotion | None = None
    if ending == "pass":
        promotion = _promote(parts, run, window)
        phase = Phase.PROMOTED
        done = (
            f"promoted version {promotion.new_version} to Production (was {promotion.old_version}) on "
            f"{len(promotion.instances)} instance(s)"
        )
        done += _after_promotion(parts, run)
    elif ending == "fail":
        p.traffic.set(run.model, without_canary(run.restore))
        failed = "; ".join(f"{gate.gate}: {gate.detail}" for gate in window.gates if gate.passed is False)
        phase, done = (
            Phase.REJECTED,
            f"Canary's share set to 0; Production unchanged (failed {failed or 'the ceiling'})",
        )
    else:
        p.traffic.set(run.model, run.restore)
        phase = Phase.ABORTED if ending == "aborted" else Phase.UNDECIDED
        done = "split restored; nothing else changed"
        if ending == "undecided":
            done += f" (Canary had {window.canary.requests} of {p.settings.min_requests} calls at the time limit)"
    now = p.clock()
    result = AnalysisResult(
        run.model, ending, phase, window.production, window.canary, window.drift, window.gates, run.share,
        run.started, run.window_start, now, promotion, done,
    )  # fmt: skip
    if phase is not Phase.PROMOTED:  # a promotion is recorded the moment the alias moved
        p.store.finish(run.model, run.owner, phase, now, figures=window.figures(now - run.window_start), note=done,
                       share=0)  # fmt: skip
    p.audit(events.DECIDED, run.model, result.to_json())
    p.say(f"{run.model}: {ending}: {done}")
    return result


def _promote(parts: LoopParts, run: Run, window: Window) -> Promotion:
    p = parts
    p.say(f"{run.model}: Canary passed every gate; promoting version {window.canary.version}")
    figures = window.figures(p.clock() - run.window_start)
    try:
        promotion = p.promoter.promote(run.model, window.canary.version, production=window.production.version)
    except PromotionIncomplete as exc:  # the alias moved: that stands, and the record says so
        now = p.clock()
        note = f"promoted, but not every instance followed: {exc}"[:500]
        p.store.finish(run.model, run.owner, Phase.PROMOTED, now, note=note, promoted_at=now, share=0,
                       figures=figures, replaced_version=window.production.version)  # fmt: skip
        p.audit(events.DECIDED, run.model, {"decision": "pass", "phase": Phase.PROMOTED.value, "note": note,
                                            "gates": [gate.to_json() for gate in window.gates]})  # fmt: skip
        _after_promotion(parts, run)
        raise
    now = p.clock()
    note = f"promoted version {promotion.new_version}"
    p.store.finish(run.model, run.owner, Phase.PROMOTED, now, promoted_at=now, share=0, figures=figures,
                   replaced_version=promotion.old_version, note=note)  # fmt: skip
    return promotion


def _after_promotion(parts: LoopParts, run: Run) -> str:
    """Put the split back and start the failure window afresh; what could not be done, as a note."""
    missed = []
    try:
        parts.traffic.set(run.model, run.restore)
    except Exception as exc:
        missed.append(f"the split could not be put back ({exc}): set it with `exa serve traffic`")
    try:
        parts.failures.reset(run.model, cooldown=True)
    except Exception as exc:
        missed.append(f"the failure window could not be reset ({exc})")
    return "; " + "; ".join(missed) if missed else "; split restored"


def give_up(parts: LoopParts, run: Run, error: BaseException) -> None:
    p = parts
    if isinstance(error, Conflict):
        record = p.store.get(run.model)
        if record is not None and record.owner not in (None, run.owner):
            return  # the hold is another run's now: so is the split
    note = f"stopped by an error: {type(error).__name__}: {error}"[:500]
    try:
        p.traffic.set(run.model, run.restore)
    except Exception as exc:
        p.say(f"{run.model}: could not put the split back ({exc}); set it with `exa serve traffic`")
    try:
        if p.store.finish(run.model, run.owner, Phase.UNDECIDED, p.clock(), note=note, share=0) is not None:
            p.audit(events.DECIDED, run.model, {"decision": "error", "note": note})
    except Exception as exc:
        p.say(f"{run.model}: could not record how the analysis ended: {exc}")


def without_canary(split: Mapping[str, int]) -> dict[str, int]:
    """``split`` with Canary's weight given to Production (empty stays empty: all to the default alias)."""
    kept = {alias: weight for alias, weight in split.items() if alias.lower() != "canary"}
    moved = sum(weight for alias, weight in split.items() if alias.lower() == "canary")
    if moved and kept:
        kept["Production"] = kept.get("Production", 0) + moved
    return kept
