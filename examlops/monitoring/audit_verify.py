"""Reading the audit trail back: the last events (``tail``) and the walk that names the first broken link.

``verify`` checks every event's hash and link from seq 1, and the chain
against the signed checkpoints in SQL and the head in Redis, so that it
catches an edited field, a deleted event, reordered events, a truncated tail,
a suffix rewritten with recomputed hashes, and a rollback to an older copy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from examlops.adapters.redis import translated
from examlops.monitoring.audit import GENESIS, HEAD, STREAM, AuditEvent
from examlops.monitoring.audit_store import CheckpointStore


def tail(client: redis.Redis, n: int) -> list[AuditEvent]:
    """The last ``n`` events, oldest first. ``StoreUnavailable``; entries that cannot be read are skipped."""
    with translated("reading the audit trail"):
        found: Any = client.xrevrange(STREAM, count=n) if n > 0 else []
    events = []
    for entry_id, fields in reversed(found):
        with contextlib.suppress(KeyError, ValueError):
            events.append(AuditEvent.from_fields(entry_id, fields))
    return events


@dataclass(frozen=True, slots=True)
class BrokenLink:
    """The first place the trail is not what was written.

    ``kind``: ``malformed``, ``edited`` (hash does not match the contents), ``link`` (prev is not the
    previous hash), ``deleted`` / ``reordered`` (a seq is missing where expected, later found or not),
    ``rewritten`` (the event at a checkpoint's seq has another hash), ``truncated`` (a checkpoint or the
    head lies past the end of the stream: tail cut or an older copy restored), ``forged_checkpoint``.
    """

    seq: int
    kind: str
    message: str
    entry_id: str | None = None


@dataclass(frozen=True, slots=True)
class VerifyReport:
    events: int
    last_seq: int
    checkpoints: int
    broken: BrokenLink | None

    @property
    def ok(self) -> bool:
        return self.broken is None

    def to_json(self) -> dict[str, Any]:
        broken = self.broken
        return {
            "ok": self.ok,
            "events": self.events,
            "last_seq": self.last_seq,
            "checkpoints": self.checkpoints,
            "broken": None
            if broken is None
            else {"seq": broken.seq, "kind": broken.kind, "message": broken.message, "entry_id": broken.entry_id},
        }


def verify(client: redis.Redis, secret: bytes, checkpoints: CheckpointStore | None, page: int = 1000) -> VerifyReport:
    """Walk the chain from seq 1 and check it against the signed checkpoints; ``StoreUnavailable``.

    Checkpoints and head are read before the stream, so appends running meanwhile never look like damage.
    Of several problems, the one at the lowest seq is reported.
    """
    from examlops.monitoring.audit_store import checkpoint_is_genuine

    signed = checkpoints.all() if checkpoints is not None else []
    forged = [cp.seq for cp in signed if not checkpoint_is_genuine(secret, cp)]
    expected_at = {cp.seq: cp.head_hash for cp in signed if cp.seq not in forged}
    problems: list[BrokenLink] = []
    if forged:
        problems.append(BrokenLink(forged[0], "forged_checkpoint", f"the checkpoint at seq {forged[0]} is not signed"))
    with translated("verifying the audit trail"):
        head: Any = client.hmget(HEAD, ["seq", "hash"])
        head_seq, head_hash = head
        walk = _Walk(expected_at)
        for entry_id, fields in _entries(client, page):
            if not walk.step(entry_id, fields):
                break
    problems += walk.problems()
    if head_seq is not None and walk.hash_at_head(int(head_seq)) not in (head_hash, None):
        problems.append(BrokenLink(int(head_seq), "rewritten", f"event {head_seq} is not the one the head names"))
    ends = [(cp, "a signed checkpoint") for cp in sorted(expected_at) if cp > walk.last]
    if head_seq is not None and int(head_seq) > walk.last:
        ends.append((int(head_seq), "the head"))
    if ends and walk.first_problem is None:
        seq, who = min(ends)
        problems.append(
            BrokenLink(
                walk.last + 1,
                "truncated",
                f"{who} names event {seq} but the chain ends at {walk.last}: the tail was cut or an older copy "
                "was restored",
            )
        )
    broken = min(problems, key=lambda p: p.seq) if problems else None
    return VerifyReport(walk.count, walk.last, len(signed), broken)


def _entries(client: redis.Redis, page: int) -> Iterator[tuple[str, dict[str, str]]]:
    start = "-"
    while True:
        found: Any = client.xrange(STREAM, min=start, count=page)
        yield from found
        if len(found) < page:
            return
        start = "(" + found[-1][0]


class _Walk:
    """The chain walk: stops checking at the first problem, then only looks for the missing seq."""

    def __init__(self, expected_at: Mapping[int, str]) -> None:
        self.expected_at = expected_at
        self.count = 0
        self.last = 0
        self.prev = GENESIS
        self.first_problem: BrokenLink | None = None
        self._missing: int | None = None
        self._found_later = False
        self._hashes_near_head: dict[int, str] = {}

    def step(self, entry_id: str, fields: Mapping[str, str]) -> bool:
        self.count += 1
        if self.first_problem is not None:
            if self._missing is not None and fields.get("seq") == str(self._missing):
                self._found_later = True
                return False
            return True
        try:
            event = AuditEvent.from_fields(entry_id, fields)
        except (KeyError, ValueError):
            return self._broken(self.last + 1, "malformed", f"entry {entry_id} is not an audit event", entry_id)
        expected = self.last + 1
        if event.seq != expected:
            self._missing = expected
            what = f"event {expected} is missing: found event {event.seq} after event {self.last}"
            return self._broken(expected, "deleted", what, entry_id)
        if event.prev != self.prev:
            return self._broken(event.seq, "link", f"event {event.seq} does not link to event {self.last}", entry_id)
        if event.computed_hash() != event.hash:
            return self._broken(event.seq, "edited", f"event {event.seq} does not match its hash", entry_id)
        signed = self.expected_at.get(event.seq)
        if signed is not None and signed != event.hash:
            before = max((s for s in self.expected_at if s < event.seq), default=0)
            what = f"event {event.seq} differs from its signed checkpoint: rewritten after event {before}"
            return self._broken(event.seq, "rewritten", what, entry_id)
        self._hashes_near_head[event.seq] = event.hash
        if len(self._hashes_near_head) > 4096:
            self._hashes_near_head.pop(next(iter(self._hashes_near_head)))
        self.last, self.prev = event.seq, event.hash
        return True

    def _broken(self, seq: int, kind: str, message: str, entry_id: str) -> bool:
        """Note the first problem; keep walking only to learn whether a missing seq comes later."""
        self.first_problem = BrokenLink(seq, kind, message, entry_id)
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
