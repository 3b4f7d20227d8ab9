"""What the failure trigger's retrain request does to a model in the loop: retrain, wait its turn, or roll
the loop's last promotion back.

``on_trigger(store, model, now, settings)`` decides, from the model's loop record:

- ``busy``: a live run holds the model (a retrain or a canary analysis): the request is dropped, and the
  caller says so (``loop.trigger_dropped``): the running loop already answers the failures;
- ``rollback``: the loop promoted the model less than ``grace_s`` ago: the new Production is failing, so it
  goes back (``rollback_promotion``) instead of a retrain;
- ``retrain`` otherwise.

``rollback_promotion`` holds the model while it moves Production back on every instance (``Promoter.rollback``,
the service `exa rollback` runs), empties the failure window (the failures were the rolled-back version's;
the retrain cooldown the trigger took still holds), appends ``loop.rolled_back`` with the reason and the
versions, and ends in ``rolled_back``. ``Conflict`` when another run holds the model; the promotion errors
propagate after the hold ends with the error as its note.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from examlops.core.errors import Conflict
from examlops.core.settings import LoopSettings
from examlops.loop import events
from examlops.loop.analysis import LoopParts
from examlops.loop.ports import Promotion
from examlops.loop.state import LoopRecord, LoopStore, Phase

Action = Literal["retrain", "busy", "rollback"]


@dataclass(frozen=True, slots=True)
class TriggerDecision:
    action: Action
    record: LoopRecord | None
    reason: str


def on_trigger(store: LoopStore, model: str, now: float, settings: LoopSettings) -> TriggerDecision:
    record = store.get(model)
    if record is not None and record.phase.active and record.updated_at >= now - settings.lease_s:
        return TriggerDecision("busy", record, f"a loop holds {model} ({record.phase.value}, run {record.run})")
    if record is not None and record.phase is Phase.PROMOTED and record.promoted_at is not None:
        age = now - record.promoted_at
        if age <= settings.grace_s:
            reason = (
                f"the loop promoted version {record.canary_version} {age:.0f} s ago (grace {settings.grace_s:g} s) "
                f"and it is failing"
            )
            return TriggerDecision("rollback", record, reason)
    return TriggerDecision("retrain", record, "")


def rollback_promotion(parts: LoopParts, model: str, *, owner: str, run: str, reason: str) -> Promotion:
    """Move Production back to what the loop's last promotion replaced (module docstring)."""
    p, now = parts, parts.clock()
    held = p.store.claim(model, owner, Phase.ROLLING_BACK, now, p.settings.lease_s, run=run,
                         note=f"rolling back: {reason}")  # fmt: skip
    if held is None:
        raise Conflict(f"{model}: another run holds the model; the rollback was not made")
    try:
        promotion = p.promoter.rollback(model)
        p.failures.reset(model, cooldown=False)
    except BaseException as exc:
        p.store.finish(model, owner, Phase.PROMOTED, p.clock(), note=f"rollback failed: {exc}"[:500])
        raise
    note = f"Production back to version {promotion.new_version} (from {promotion.old_version}): {reason}"
    p.audit(events.ROLLED_BACK, model, {
        "reason": reason, "from_version": promotion.old_version, "to_version": promotion.new_version,
        "instances": list(promotion.instances), "run": run, "promoted_at": held.promoted_at,
    })  # fmt: skip
    p.store.finish(model, owner, Phase.ROLLED_BACK, p.clock(), note=note, promoted_at=None)
    p.say(f"{model}: {note}")
    return promotion
