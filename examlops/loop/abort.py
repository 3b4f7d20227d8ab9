"""Stopping an analysis: ``abort_analysis(parts, model)``.

A live run that holds the model is asked to stop (``LoopStore.request_abort``): it puts the split back and
ends in ``aborted`` at its next look (within ``poll_s``). A run that holds the model but showed no sign of
life for a lease (it died) is ended here: its split is put back and the record ends in ``aborted``.
``NotFound`` when no run holds the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from examlops.core.errors import NotFound
from examlops.loop.ports import LoopParts
from examlops.loop.recovery import end_run
from examlops.loop.state import LoopRecord


@dataclass(frozen=True, slots=True)
class AbortResult:
    how: Literal["asked", "ended"]
    """``asked``: the live run stops at its next look; ``ended``: the run was gone and the split is back."""
    record: LoopRecord


def abort_analysis(parts: LoopParts, model: str, *, actor: str) -> AbortResult:
    p, now = parts, parts.clock()
    record = p.store.request_abort(model, now)
    if record is None:
        raise NotFound(f"no loop holds {model}: nothing to abort (`exa loop status {model}`)")
    if record.updated_at >= now - p.settings.lease_s:
        return AbortResult("asked", record)
    ended = end_run(p, record, f"aborted by {actor}; its run had stopped answering")
    return AbortResult("ended", ended or record)
