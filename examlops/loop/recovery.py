"""Ending a run that died while it held a model: ``end_dead_run`` and ``end_run``.

A canary run that stops without ending its hold (its process killed, its Prefect run cancelled or crashed)
leaves Canary's share in the split. ``end_run`` puts back the split the record kept (``restore``) when the
run was in ``canary``, and ends the hold as ``aborted`` with why; ``end_dead_run`` does so only when the
holder showed no sign of life for ``lease_s``. Every run calls ``end_dead_run`` before it claims a model, so
the next loop never takes a dead run's split for the site's own; the canary flow's cancellation and crash
hooks call ``end_run`` at once. Both return the ended record, or None when there was nothing to end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from examlops.loop import events
from examlops.loop.state import LoopRecord, Phase

if TYPE_CHECKING:
    from examlops.loop.ports import LoopParts


def end_dead_run(parts: LoopParts, model: str) -> LoopRecord | None:
    record = parts.store.get(model)
    if record is None or not record.stale(parts.clock(), parts.settings.lease_s):
        return None
    return end_run(parts, record, f"its run ({record.run or record.owner}) stopped answering")


def end_run(parts: LoopParts, record: LoopRecord, why: str) -> LoopRecord | None:
    """End ``record``'s hold (as its owner) and put its split back; None when it no longer holds the model."""
    if not record.phase.active or record.owner is None:
        return None
    note = f"ended: {why}; the split was put back" if record.phase is Phase.CANARY else f"ended: {why}"
    ended = parts.store.finish(record.model, record.owner, Phase.ABORTED, parts.clock(), note=note[:500], share=0)
    if ended is not None and record.phase is Phase.CANARY:  # only the run that ended the hold restores its split
        parts.traffic.set(record.model, record.restore)
    if ended is not None:
        parts.audit(events.DECIDED, record.model, {"decision": "aborted", "note": note, "run": record.run,
                                                   "restored_split": record.restore})  # fmt: skip
        parts.say(f"{record.model}: {note}")
    return ended
