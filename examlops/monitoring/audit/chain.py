"""The audit chain's format: events, their hash, and what an appender hands over (``Entry``, ``Row``).

An event's ``hash`` is the hex sha256 of the canonical JSON array
``["examlops.audit.v1", seq, ts, type, subject, data, prev]`` where ``seq`` is an
integer and every other element is the exact string stored (``ts`` is UNIX
seconds formatted ``%.6f``; ``data`` is canonical JSON: sorted keys, no spaces,
UTF-8, no NaN). ``prev`` is the previous event's hash, ``GENESIS`` (64 zeros)
for seq 1. The hash covers only these strings, so an event verifies wherever it
is kept: in the Redis stream (``store``) or in the archive (``segments``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from examlops.core.jsoncodec import ascii_array
from examlops.core.jsoncodec import canonical as canonical_json  # the event data as stored and hashed

FORMAT = "examlops.audit.v1"
GENESIS = "0" * 64
FIELDS = ("seq", "ts", "type", "subject", "data", "prev", "hash")

# Event types. Control actions are appended by whoever performs them (serving, flows, the CLI).
INFERENCE_SERVED = "inference.served"
TRAFFIC_CHANGED = "traffic.changed"
"""Written before a split is stored (no event, no change); ``traffic.change_failed`` follows when it was not."""
TRAFFIC_CHANGE_FAILED = "traffic.change_failed"
ALIAS_MOVE_INTENDED = "alias.move_intended"
"""Written before an alias moves in the registry; ``alias.moved`` or ``alias.move_failed`` follows."""
ALIAS_MOVED = "alias.moved"
ALIAS_MOVE_FAILED = "alias.move_failed"
MODEL_RELOADED = "model.reloaded"
RELOAD_REFUSED = "reload.refused"
RETRAIN_REQUESTED = "retrain.requested"


def format_ts(ts: float) -> str:
    return f"{ts:.6f}"


def event_hash(seq: int, ts: str, type: str, subject: str, data: str, prev: str) -> str:
    return hashlib.sha256(ascii_array([FORMAT, seq, ts, type, subject, data, prev])).hexdigest()


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One event as stored; ``entry_id`` is its stream id ('' before it is written)."""

    seq: int
    ts: str
    type: str
    subject: str
    data: str
    prev: str
    hash: str
    entry_id: str = ""

    @classmethod
    def chained(cls, seq: int, prev: str, ts: str, type: str, subject: str, data: str) -> AuditEvent:
        return cls(seq, ts, type, subject, data, prev, event_hash(seq, ts, type, subject, data, prev))

    @classmethod
    def from_fields(cls, entry_id: str, fields: Mapping[str, Any]) -> AuditEvent:
        """``ValueError`` (or ``KeyError``) for an entry that lacks a field, has a non-integer seq or a non-text."""
        f = fields
        texts = (f["ts"], f["type"], f["subject"], f["data"], f["prev"], f["hash"])
        if not all(type(text) is str for text in texts):
            raise ValueError(f"entry {entry_id}: a field is not a string")
        return cls(int(f["seq"]), *texts, entry_id)

    def fields(self) -> list[str]:
        return [str(self.seq), self.ts, self.type, self.subject, self.data, self.prev, self.hash]

    def computed_hash(self) -> str:
        return event_hash(self.seq, self.ts, self.type, self.subject, self.data, self.prev)

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "time": datetime.fromtimestamp(float(self.ts), UTC).isoformat(),
            "type": self.type,
            "subject": self.subject,
            "data": json.loads(self.data),
            "prev": self.prev,
            "hash": self.hash,
            "entry_id": self.entry_id,
        }


@dataclass(frozen=True, slots=True)
class SideWrite:
    """A stream entry written atomically with an event (the drift snapshot); ``member`` is SADDed to ``index``.

    ``names`` are the entry's field names, ``values`` their values in the same order. The side writes of
    one ``append_many`` call share their names (they are sent once per call).
    """

    stream: str
    names: tuple[str, ...]
    values: tuple[str, ...]
    index: str = ""
    member: str = ""

    @property
    def fields(self) -> dict[str, str]:
        return dict(zip(self.names, self.values, strict=True))


@dataclass(frozen=True, slots=True)
class Entry:
    """What to append. ``once_key``: skip the entry (and its side write) when this key exists; set it otherwise."""

    type: str
    subject: str
    data: Mapping[str, Any]
    ts: float
    once_key: str = ""
    side: SideWrite | None = None
    once_ttl_s: float | None = None
    """How long the once key lives; None: the trail's ``once_ttl_s``. A call sets its entries' longest."""
    encoded: str = field(init=False, default="")

    def __post_init__(self) -> None:
        object.__setattr__(self, "encoded", canonical_json(dict(self.data)))

    def row(self) -> Row:
        """The entry as the append script takes it; ``ValueError`` for a side write with no stream or fields."""
        side = self.side
        if side is None:
            return (self.once_key, "", (), "", "", format_ts(self.ts), self.type, self.subject, self.encoded)
        if not side.stream or not side.names:
            raise ValueError("a side write needs a stream and at least one field")
        return (
            self.once_key, side.stream, side.values, side.index, side.member, format_ts(self.ts), self.type,
            self.subject, self.encoded,
        )  # fmt: skip


Row = tuple[str, str, Sequence[str], str, str, str, str, str, str]
"""One event as ``AuditTrail.append_rows`` takes it: once key ('' = none), side stream ('' = none), the side
write's values (in the call's field order), index set ('' = none), index member, ts (``format_ts``), type,
subject, data (canonical JSON, ``jsoncodec.canonical``). The recorder builds these directly: one per bus job.
"""
