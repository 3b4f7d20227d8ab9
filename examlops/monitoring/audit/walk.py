"""The chain walk behind ``verify``: event by event from seq 1, it names the first place the chain breaks.

Fed the archived events, then ``end_archive()``, then the stream's entries. A
stream entry that is also archived (the archive run crashed between writing a
segment and trimming the stream) must be the same event: it is checked
against its own hash, its neighbours and the last archived hash, then skipped.
``seen``, when given, is called with each event once it has verified, in chain order, up to the first
problem: what a reader may trust of the trail (`exa audit verify`'s alias check folds it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from examlops.monitoring.audit.chain import GENESIS, AuditEvent

NEAR_HEAD = 4096
"""How many of the last hashes are kept to compare with the head."""


@dataclass(frozen=True, slots=True)
class BrokenLink:
    """The first place the trail is not what was written.

    ``kind``: ``malformed``, ``edited`` (hash does not match the contents), ``link`` (prev is not the
    previous hash), ``deleted`` / ``reordered`` (a seq is missing where expected, later found or not),
    ``rewritten`` (the event at a checkpoint's seq, or an archived one, has another hash), ``truncated`` (a
    checkpoint or the head lies past the end: tail cut or an older copy restored), ``forged_checkpoint``.
    ``entry_id`` is the stream id, or ``file:line`` in the archive.
    """

    seq: int
    kind: str
    message: str
    entry_id: str | None = None


class ChainWalk:
    """Stops checking at the first problem, then only looks for the missing seq."""

    def __init__(self, expected_at: Mapping[int, str], seen: Callable[[AuditEvent], None] | None = None) -> None:
        self.expected_at = expected_at
        self.seen = seen
        self.count = 0
        self.last = 0
        self.prev = GENESIS
        self.archived = 0
        """How many events the archive held (those walked before ``end_archive``)."""
        self.first_problem: BrokenLink | None = None
        self._archive_end: tuple[int, str] | None = None
        self._overlap_prev: str | None = None
        self._missing: int | None = None
        self._found_later = False
        self._hashes_near_head: dict[int, str] = {}

    def end_archive(self) -> None:
        self.archived = self.count
        self._archive_end = (self.last, self.prev) if self.last else None

    @property
    def archive_last(self) -> int:
        return self._archive_end[0] if self._archive_end is not None else 0

    def step(self, location: str, fields: Mapping[str, Any]) -> bool:
        """Walk one entry; False once walking further can tell nothing more."""
        if self.first_problem is not None:
            self.count += 1
            if self._missing is not None and str(fields.get("seq")) == str(self._missing):
                self._found_later = True
                return False
            return True
        try:
            event = AuditEvent.from_fields(location, fields)
        except (KeyError, ValueError, TypeError):
            self.count += 1
            return self._broken(self.last + 1, "malformed", f"entry {location} is not an audit event", location)
        if self._archive_end is not None and event.seq <= self._archive_end[0]:
            return self._overlap(event, location)
        self.count += 1
        expected = self.last + 1
        if event.seq != expected:
            self._missing = expected
            what = f"event {expected} is missing: found event {event.seq} after event {self.last}"
            return self._broken(expected, "deleted", what, location)
        if event.prev != self.prev:
            return self._broken(event.seq, "link", f"event {event.seq} does not link to event {self.last}", location)
        if event.computed_hash() != event.hash:
            return self._broken(event.seq, "edited", f"event {event.seq} does not match its hash", location)
        signed = self.expected_at.get(event.seq)
        if signed is not None and signed != event.hash:
            before = max((s for s in self.expected_at if s < event.seq), default=0)
            what = f"event {event.seq} differs from its signed checkpoint: rewritten after event {before}"
            return self._broken(event.seq, "rewritten", what, location)
        self._hashes_near_head[event.seq] = event.hash
        if len(self._hashes_near_head) > NEAR_HEAD:
            self._hashes_near_head.pop(next(iter(self._hashes_near_head)))
        self.last, self.prev = event.seq, event.hash
        if self.seen is not None:
            self.seen(event)
        return True

    def _overlap(self, event: AuditEvent, location: str) -> bool:
        """A stream entry that is archived too: the same chain, ending at the last archived event."""
        assert self._archive_end is not None
        last, last_hash = self._archive_end
        if event.computed_hash() != event.hash:
            return self._broken(
                event.seq, "edited", f"event {event.seq} (archived too) does not match its hash", location
            )
        if self._overlap_prev is not None and event.prev != self._overlap_prev:
            return self._broken(event.seq, "link", f"event {event.seq} (archived too) does not link back", location)
        if event.seq == last and event.hash != last_hash:
            return self._broken(event.seq, "rewritten", f"event {event.seq} differs from the archived one", location)
        self._overlap_prev = event.hash
        return True

    def _broken(self, seq: int, kind: str, message: str, location: str) -> bool:
        """Note the first problem; keep walking only to learn whether a missing seq comes later."""
        self.first_problem = BrokenLink(seq, kind, message, location)
        return self._missing is not None

    def hash_at_head(self, seq: int) -> str | None:
        return self._hashes_near_head.get(seq)

    def problems(self) -> list[BrokenLink]:
        problem = self.first_problem
        if problem is None:
            return []
        if problem.kind == "deleted" and self._found_later:
            message = f"event {problem.seq} is out of order: {problem.message.split(': ', 1)[1]}"
            return [BrokenLink(problem.seq, "reordered", message, problem.entry_id)]
        return [problem]
