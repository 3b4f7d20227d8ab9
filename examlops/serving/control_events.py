"""The pipeline's control events: what a traffic change or a reload hands to the audit trail's sink.

``ControlEvents(sink)``: ``emit(type, subject, data)`` hands one event to ``sink`` (blocking: call it from a
thread); with no sink it does nothing. A sink that raises never fails the action it records: the failure is
logged once per event, without a traceback.

``reloaded(changes, actor)`` records a reload (async: the sink runs in a thread): a ``model.reloaded`` event
for every swap, load or removal, and a ``reload.refused`` event (with its reason) once per refused version
of an alias, since the reload poll retries a refused version on every round; a version that loads later
clears the memo. Every event names ``actor``, the identity that asked.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from examlops.serving.hotset import ReloadChange
from examlops.serving.ports import ControlEventSink

log = logging.getLogger("examlops.serving.pipeline")

Event = tuple[str, str, dict[str, Any]]
"""``(type, subject, data)``."""


class ControlEvents:
    """The pipeline's side of the audit trail (contract above)."""

    def __init__(self, sink: ControlEventSink | None) -> None:
        self._sink = sink
        self._refused: dict[tuple[str, str], str | None] = {}

    def emit(self, type: str, subject: str, data: dict[str, Any]) -> None:
        if self._sink is None:
            return
        try:
            self._sink(type, subject, data)
        except Exception as exc:  # the audit trail's store is down: say so once per event, no traceback
            log.error("could not record the control event %s of %s: %s", type, subject, exc)

    async def reloaded(self, changes: list[ReloadChange], actor: str) -> None:
        events = [(type, subject, {**data, "actor": actor}) for type, subject, data in self._reload_events(changes)]
        if events and self._sink is not None:
            await asyncio.to_thread(self._emit_all, events)

    def _reload_events(self, changes: list[ReloadChange]) -> list[Event]:
        events: list[Event] = []
        for change in changes:
            slot = (change.model, change.alias)
            data: dict[str, Any] = {
                "alias": change.alias,
                "old_version": change.old_version,
                "new_version": change.new_version,
                "outcome": change.outcome,
            }
            if change.outcome == "refused":
                if self._refused.get(slot) != change.new_version:
                    self._refused[slot] = change.new_version
                    events.append(("reload.refused", change.model, {**data, "reason": change.reason}))
            elif change.outcome in ("swapped", "loaded", "removed"):
                self._refused.pop(slot, None)
                events.append(("model.reloaded", change.model, data))
        return events

    def _emit_all(self, events: list[Event]) -> None:
        for event in events:
            self.emit(*event)
