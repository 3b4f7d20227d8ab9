"""Retention of the audit trail: move the events a signed checkpoint covers out of Redis into the archive.

One run (``Archiver.run``), under the archive folder's lock:

1. The archive's last event ``A`` (from its files) and the Redis watermark
   ``W`` (the last event trimmed from the stream). ``W > A`` means archive files
   are missing, or another state folder archives this trail: ``Conflict``.
2. The newest genuine checkpoint ``C`` past ``A``. The stream's events
   ``A+1..C`` are checked as they are read (contiguous, each linked to the one
   before and matching its hash, event ``C`` matching the checkpoint) and
   written to one new segment, committed only whole (``segments``). A broken
   chain commits nothing: ``Conflict`` naming the event (``exa audit verify``).
3. The stream is trimmed up to the archive's last event, and the watermark
   moved, in one script that refuses when another archiver moved the watermark.

A crash at any point loses nothing and archives nothing twice: before step 2
commits, the segment does not exist; after it, the next run finds the events in
the archive (it skips the copies still in the stream, checking they are the
same) and only does step 3. Appends go on meanwhile: they only add entries
after the newest, which the trim never reaches.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from examlops.core.errors import Conflict
from examlops.monitoring.audit.chain import GENESIS, AuditEvent
from examlops.monitoring.audit.checkpoints import AuditCheckpoint, CheckpointStore, checkpoint_is_genuine
from examlops.monitoring.audit.segments import ArchiveFiles
from examlops.monitoring.audit.store import Watermark

log = logging.getLogger(__name__)

NEWEST_CHECKPOINTS = 64
"""How many of the newest checkpoints are looked at for a genuine one (forged ones are skipped)."""


class ArchiveSource(Protocol):
    """The live chain as the archiver needs it (``RedisAuditStore``); ``StoreUnavailable``."""

    def watermark(self) -> Watermark | None: ...
    def entries(self, page: int = 1000) -> Iterator[tuple[str, dict[str, str]]]: ...
    def trim_archived(self, expected: int, last: Watermark) -> int: ...


@dataclass(frozen=True, slots=True)
class ArchiveReport:
    archived: int
    """Events written to a new segment by this run."""
    first_seq: int
    last_seq: int
    segment: str | None
    trimmed: int
    """Stream entries this run removed (a crashed run's leftovers included)."""
    archive_last_seq: int
    """The archive's last event after the run (0: empty)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Archiver:
    """Archives the checkpointed part of the chain (see the module docstring)."""

    def __init__(
        self,
        source: ArchiveSource,
        checkpoints: CheckpointStore,
        secret: bytes,
        files: ArchiveFiles,
        *,
        page: int = 1000,
    ) -> None:
        self.source = source
        self.checkpoints = checkpoints
        self.secret = secret
        self.files = files
        self.page = page

    def run(self) -> ArchiveReport:
        """One archive run; ``Conflict`` (nothing committed) or ``StoreUnavailable``."""
        with self.files.locked():
            mark = self.source.watermark()
            try:
                done = self.files.last()
            except (KeyError, ValueError) as exc:
                raise Conflict(f"the last line of the audit archive in {self.files.directory} cannot be read") from exc
            done_seq = done.seq if done is not None else 0
            marked = mark.seq if mark is not None else 0
            if marked > done_seq:
                raise Conflict(
                    f"Redis records audit events up to {marked} as archived, but the archive in "
                    f"{self.files.directory} ends at event {done_seq}: its files are missing, or another state "
                    "folder archives this trail"
                )
            target = self._target(done_seq)
            first, segment = done_seq + 1, None
            if target is not None:
                done, segment = self._write(done, target)
            last_seq = done.seq if done is not None else 0
            trimmed = 0
            if done is not None and last_seq > marked:
                if not re.fullmatch(r"\d+-\d+", done.entry_id):
                    raise Conflict(f"the audit archive's last event ({last_seq}) names no stream entry to trim up to")
                trimmed = self.source.trim_archived(marked, Watermark(done.seq, done.hash, done.entry_id))
            archived = last_seq - first + 1 if target is not None else 0
            if archived or trimmed:
                log.info("audit archive: %d events archived, %d trimmed from the stream", archived, trimmed)
            return ArchiveReport(
                archived,
                first if archived else 0,
                last_seq if archived else 0,
                segment,
                trimmed,
                last_seq,
            )

    def _target(self, after: int) -> AuditCheckpoint | None:
        """The newest genuine checkpoint past event ``after``."""
        for checkpoint in self.checkpoints.newest(NEWEST_CHECKPOINTS):
            if checkpoint.seq <= after:
                return None
            if checkpoint_is_genuine(self.secret, checkpoint):
                return checkpoint
            log.warning("audit checkpoint %d is not signed with this secret: not archiving up to it", checkpoint.seq)
        return None

    def _write(self, done: AuditEvent | None, target: AuditCheckpoint) -> tuple[AuditEvent, str]:
        """Events after ``done`` up to the checkpoint's, checked, as one committed segment: the last, its file."""
        done_seq, prev = (done.seq, done.hash) if done is not None else (0, GENESIS)
        last: AuditEvent | None = None
        with self.files.segment(done_seq + 1, target.seq) as out:
            for entry_id, fields in self.source.entries(self.page):
                try:
                    event = AuditEvent.from_fields(entry_id, fields)
                except (KeyError, ValueError) as exc:
                    raise _broken(f"stream entry {entry_id} is not an audit event") from exc
                if event.computed_hash() != event.hash:
                    raise _broken(f"event {event.seq} ({entry_id}) does not match its hash")
                if event.seq <= done_seq:  # archived by a run that crashed before trimming
                    if event.seq == done_seq and event.hash != prev:
                        raise _broken(f"event {event.seq} in the stream differs from the archived one")
                    continue
                if event.seq != out.next:
                    raise _broken(f"event {out.next} is missing from the stream (found {event.seq})")
                if event.prev != prev:
                    raise _broken(f"event {event.seq} does not link to event {event.seq - 1}")
                out.add(event)
                prev, last = event.hash, event
                if event.seq == target.seq:
                    break
            if last is None or last.seq != target.seq:
                raise _broken(f"the stream ends at event {out.next - 1}, before checkpoint {target.seq}")
            if last.hash != target.head_hash:
                raise _broken(f"event {target.seq} differs from its signed checkpoint")
        return last, str(out.path)


def _broken(what: str) -> Conflict:
    return Conflict(f"the audit chain is broken ({what}); nothing archived: see `exa audit verify`")
