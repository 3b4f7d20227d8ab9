"""What the failure trigger's retrain request does to a model in the loop: retrain, drop it, or roll the
loop's last promotion back.

``on_trigger(parts, model, requested_at)`` decides, from the model's loop record and its traces:

- ``busy``: a live run holds the model (a retrain or a canary analysis): the request is dropped, and the
  caller says so (``loop.trigger_dropped``): the running loop already answers the failures;
- within ``grace_s`` of the loop's promotion: ``rollback`` when the promoted version itself fails (its own
  traced calls since the promotion: at least ``rollback_min_calls`` of them, a model-failure rate above
  ``max_failure_rate``, the ceiling it had to meet as a canary); ``busy`` (dropped) when the failures were
  another version's (the one it replaced, still answering calls in flight, or a pinned alias), or when the
  request was made before the promotion;
- ``retrain`` otherwise.

``rollback_promotion`` holds the model while it moves Production back on every instance (``Promoter.rollback``,
the service `exa rollback` runs, only while Production is still the loop's version), empties the failure
window (the failures were the rolled-back version's; the retrain cooldown the trigger took still holds),
appends ``loop.rolled_back`` and ends in ``rolled_back``: also when an instance did not follow (the alias
moved; its note names the instance; ``PromotionIncomplete`` propagates). When Production was moved by
someone else meanwhile (``Conflict``) the loop ends in ``serving`` and leaves it; other errors end the hold
as it was (``promoted``) and propagate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from examlops.core.errors import Conflict, PromotionIncomplete
from examlops.loop import events
from examlops.loop.figures import figures_of
from examlops.loop.ports import LoopParts, Promotion
from examlops.loop.state import LoopRecord, Phase

Action = Literal["retrain", "busy", "rollback"]


@dataclass(frozen=True, slots=True)
class TriggerDecision:
    action: Action
    record: LoopRecord | None
    reason: str


def on_trigger(parts: LoopParts, model: str, requested_at: float | None = None) -> TriggerDecision:
    p, now = parts, parts.clock()
    record = p.store.get(model)
    if record is not None and record.held(now, p.settings.lease_s):
        return TriggerDecision("busy", record, f"a loop holds {model} ({record.phase.value}, run {record.run})")
    promoted = record.promoted_at if record is not None and record.phase is Phase.PROMOTED else None
    if record is None or promoted is None or now - promoted > p.settings.grace_s:
        return TriggerDecision("retrain", record, "")
    if requested_at and requested_at < promoted:
        return TriggerDecision("busy", record, f"the request was made before the loop promoted {model}")
    version = record.canary_version or ""
    figures = figures_of(p.calls.calls(model, promoted), version)
    if figures.requests < p.settings.rollback_min_calls or figures.failure_rate <= p.settings.max_failure_rate:
        return TriggerDecision("busy", record, (
            f"version {version}, promoted {now - promoted:.0f} s ago, failed {figures.model_failures} of its "
            f"{figures.requests} calls since: the failures were another version's"
        ))  # fmt: skip
    reason = (
        f"the loop promoted version {version} {now - promoted:.0f} s ago (grace {p.settings.grace_s:g} s) and it "
        f"failed {figures.model_failures} of its {figures.requests} calls since"
    )
    return TriggerDecision("rollback", record, reason)


def rollback_promotion(parts: LoopParts, record: LoopRecord, *, owner: str, run: str, reason: str) -> Promotion:
    """Move Production back to what the loop's last promotion replaced (module docstring)."""
    p, model = parts, record.model
    now = p.clock()
    held = p.store.claim(model, owner, Phase.ROLLING_BACK, now, p.settings.lease_s, run=run, started_at=now,
                         note=f"rolling back: {reason}"[:500])  # fmt: skip
    if held is None:
        raise Conflict(f"{model}: another run holds the model; the rollback was not made")
    try:
        promotion = p.promoter.rollback(model, production=record.canary_version or "")
    except PromotionIncomplete as exc:  # the alias moved back: record that, then say who lags
        _rolled_back(parts, model, owner, run, reason, record.canary_version, record.replaced_version, exc)
        raise
    except Conflict as exc:
        p.store.finish(model, owner, Phase.SERVING, p.clock(), note=f"not rolled back: {exc}"[:500], promoted_at=None)
        raise
    except BaseException as exc:
        p.store.finish(model, owner, Phase.PROMOTED, p.clock(), note=f"rollback failed: {exc}"[:500])
        raise
    _rolled_back(parts, model, owner, run, reason, promotion.old_version, promotion.new_version, None,
                 promotion.instances)  # fmt: skip
    return promotion


def _rolled_back(
    parts: LoopParts, model: str, owner: str, run: str, reason: str, from_version: str | None,
    to_version: str | None, lagging: BaseException | None, instances: tuple[str, ...] = (),
) -> None:  # fmt: skip
    p = parts
    note = f"Production back to version {to_version} (from {from_version}): {reason}"
    if lagging is not None:
        note += f"; not every instance followed: {lagging}"
    p.store.finish(model, owner, Phase.ROLLED_BACK, p.clock(), note=note[:500], promoted_at=None)
    try:
        p.failures.reset(model, cooldown=False)
    except Exception as exc:
        p.say(f"{model}: the failure window could not be reset: {exc}")
    p.audit(events.ROLLED_BACK, model, {"reason": reason, "from_version": from_version, "to_version": to_version,
                                        "instances": list(instances), "run": run, "note": note})  # fmt: skip
    p.say(f"{model}: {note}")
