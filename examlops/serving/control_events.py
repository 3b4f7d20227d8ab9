"""The pipeline's control events: what a traffic change or a reload hands to the audit trail's sink.

``ControlEvents(sink)`` hands events to ``sink`` in two ways (blocking: call them from a thread). With no sink
no event is written and a traffic change is stored all the same (tests, scripts).

- ``emit(type, subject, data)``: the event follows an action that stands whatever happens to it (a reload),
  so a sink that raises never fails that action: the failure is logged once per event, without a traceback;
- ``change_traffic(model, split, actor, store)``: the event comes first, as the record of the change, under
  the rule promotions follow (no record, no change). ``traffic.changed`` (``weights``, ``actor``) is handed
  to the sink, then ``store()`` stores the split. When the sink raises ``StoreUnavailable`` (the trail cannot
  be written) ``store`` is never called and ``StoreUnavailable`` says the split was not changed; any other
  error of the sink passes unchanged, also before ``store``. When ``store`` raises, ``traffic.change_failed``
  (the same fields and ``error``) follows the first event and ``store``'s error is raised, with a note when
  that second event could not be written either (the trail then says a change happened that did not).
  One case this cannot prevent: an append Redis received but did not answer within the client's timeout (a
  paused or stalled Redis) is refused like any other, yet Redis may run it once it resumes, so the trail can
  then hold a ``traffic.changed`` for a split that was never stored (the error says so; the split, and SQL's
  ``trafficchange`` history, are what was stored).

``reloaded(changes, actor)`` records a reload (async: the sink runs in a thread): a ``model.reloaded`` event
for every swap, load or removal, and a ``reload.refused`` event (with its reason) once per refused version
of an alias, since the reload poll retries a refused version on every round; a version that loads later
clears the memo. Every event names ``actor``, the identity that asked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from examlops.core.errors import StoreUnavailable
from examlops.serving.hotset import ReloadChange
from examlops.serving.ports import ControlEventSink

log = logging.getLogger("examlops.serving.pipeline")

TRAFFIC_CHANGED = "traffic.changed"
TRAFFIC_CHANGE_FAILED = "traffic.change_failed"
"""The event types of a traffic change (``monitoring.audit.chain`` names them for the trail's readers)."""

Event = tuple[str, str, dict[str, Any]]
"""``(type, subject, data)``."""


class ControlEvents:
    """The pipeline's side of the audit trail (contract above)."""

    def __init__(self, sink: ControlEventSink | None) -> None:
        self._sink = sink
        self._refused: dict[tuple[str, str], str | None] = {}

    def change_traffic(self, model: str, split: dict[str, int], actor: str, store: Callable[[], None]) -> None:
        data: dict[str, Any] = {"weights": split, "actor": actor}
        if self._sink is None:
            store()
            return
        try:
            self._sink(TRAFFIC_CHANGED, model, data)
        except StoreUnavailable as exc:
            raise StoreUnavailable(  # what matters first: an HTTP reply keeps 256 characters of it
                f"{model}: the traffic split was not changed: its {TRAFFIC_CHANGED} audit event could not be "
                f"written (a stalled Redis may still write it later; the split stays as it was): {exc}"
            ) from exc
        try:
            store()
        except Exception as exc:
            try:
                self._sink(TRAFFIC_CHANGE_FAILED, model, {**data, "error": f"{type(exc).__name__}: {exc}"[:500]})
            except Exception as lost:
                exc.add_note(f"its {TRAFFIC_CHANGE_FAILED} audit event was not written either: {lost}")
            raise

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
