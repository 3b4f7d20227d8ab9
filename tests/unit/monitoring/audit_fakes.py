"""Fakes at the audit ports: the live chain (``ChainSource``/``ArchiveSource``) and the checkpoint store.

``InMemoryAuditStore`` keeps the stream as a list of (id, fields) and answers the archive trim with the
semantics of ``store.TRIM_SCRIPT``; it can be told to fail while reading or trimming, as a crash would.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from examlops.core.errors import Conflict, StoreUnavailable
from examlops.monitoring.audit.chain import FIELDS, GENESIS, AuditEvent, canonical_json, format_ts
from examlops.monitoring.audit.checkpoints import AuditCheckpoint, new_checkpoint
from examlops.monitoring.audit.store import Watermark

SECRET = b"test-secret"


@dataclass
class InMemoryCheckpoints:
    rows: dict[int, AuditCheckpoint] = field(default_factory=dict)

    def save(self, checkpoint: AuditCheckpoint) -> None:
        self.rows.setdefault(checkpoint.seq, checkpoint)

    def all(self) -> list[AuditCheckpoint]:
        return [self.rows[seq] for seq in sorted(self.rows)]

    def newest(self, limit: int) -> list[AuditCheckpoint]:
        return [self.rows[seq] for seq in sorted(self.rows, reverse=True)[:limit]]


@dataclass
class InMemoryAuditStore:
    stream: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    mark: Watermark | None = None
    head_: tuple[int, str] = (0, GENESIS)
    fail_reading_after: int | None = None
    """Raise ``StoreUnavailable`` after yielding this many entries (once)."""
    fail_trims: int = 0
    """Raise ``StoreUnavailable`` for this many trims, before trimming."""
    next_id: int = 1

    def add(self, type: str = "t", subject: str = "s", data: dict[str, Any] | None = None) -> AuditEvent:
        """Append one event as the append script would."""
        seq, prev = self.head_
        event = AuditEvent.chained(seq + 1, prev, format_ts(1000.0 + seq), type, subject, canonical_json(data or {}))
        entry_id = f"{self.next_id}-0"
        self.next_id += 1
        self.stream.append((entry_id, dict(zip(FIELDS, event.fields(), strict=True))))
        self.head_ = (event.seq, event.hash)
        return dataclasses.replace(event, entry_id=entry_id)

    def fill(self, n: int, checkpoints: InMemoryCheckpoints | None = None, every: int = 0) -> None:
        for _ in range(n):
            event = self.add(data={"seq": self.head_[0] + 1})
            if checkpoints is not None and every and event.seq % every == 0:
                checkpoints.save(new_checkpoint(SECRET, event.seq, event.hash, 0.0))

    def head(self) -> tuple[int, str]:
        return self.head_

    def watermark(self) -> Watermark | None:
        return self.mark

    def entries(self, page: int = 1000) -> Iterator[tuple[str, dict[str, str]]]:
        for n, (entry_id, fields) in enumerate(list(self.stream)):
            if self.fail_reading_after is not None and n == self.fail_reading_after:
                self.fail_reading_after = None
                raise StoreUnavailable("Redis cannot be reached (reading the audit trail): gone")
            yield entry_id, dict(fields)

    def last(self, n: int) -> list[tuple[str, dict[str, str]]]:
        return [(entry_id, dict(fields)) for entry_id, fields in self.stream[-n:]] if n > 0 else []

    def trim_archived(self, expected: int, last: Watermark) -> int:
        if self.fail_trims:
            self.fail_trims -= 1
            raise StoreUnavailable("Redis cannot be reached (trimming the archived audit events): gone")
        current = self.mark.seq if self.mark is not None else 0
        if current == last.seq:
            return 0
        if current != expected:
            raise Conflict(f"another archiver moved the audit archive watermark to event {current}")
        found = [fields for entry_id, fields in self.stream if entry_id == last.entry_id]
        if not found or (found[0]["seq"], found[0]["hash"]) != (str(last.seq), last.hash):
            raise Conflict(f"audit event {last.seq} is no longer in the stream as archived")
        bound = int(last.entry_id.split("-")[0])
        before = len(self.stream)
        self.stream = [(i, f) for i, f in self.stream if int(i.split("-")[0]) > bound]
        self.mark = last
        return before - len(self.stream)

    def edit(self, seq: int, **changes: str) -> None:
        """Change the stored fields of event ``seq`` (as someone with Redis access could)."""
        for _entry_id, fields in self.stream:
            if fields["seq"] == str(seq):
                fields.update(changes)


def rewrite_line(path: Any, seq: int, **changes: Any) -> None:
    """Change the fields of event ``seq`` in an archive segment file."""
    lines = path.read_text().splitlines()
    for n, line in enumerate(lines):
        record = json.loads(line)
        if record["seq"] == seq:
            record.update(changes)
            lines[n] = json.dumps(record, separators=(",", ":"))
    path.write_text("\n".join(lines) + "\n")
