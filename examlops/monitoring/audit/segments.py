"""The audit archive on disk: append-only JSONL segment files, one per archive run.

``<state>/audit/archive/<first seq>-<last seq>.jsonl`` (seqs zero-padded to 12
digits) holds events ``first``..``last``, one JSON object a line: the stored
fields (``seq`` an integer; ``ts type subject data prev hash`` the exact
strings the hash covers) and ``entry_id``, the stream id the event had.

A segment is written under a temporary name, fsynced, then linked to its final
name, which fails rather than replace an existing file: a segment is there
whole or not at all, and nothing rewrites or deletes one. A temporary file left
by a crash is removed by the next archive run. ``locked()`` lets one archive run
at a time use the folder, and none while a reader holds ``reading()``
(``Conflict`` for the run).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from examlops.core.errors import Conflict
from examlops.monitoring.audit.chain import AuditEvent

SUFFIX = ".jsonl"
TEMPORARY = ".partial"
LOCK = ".lock"


def segment_name(first: int, last: int) -> str:
    return f"{first:012d}-{last:012d}{SUFFIX}"


def encode(event: AuditEvent) -> str:
    """One archive line (ASCII JSON, so any stored string, a lone surrogate included, reads back as it was)."""
    record = dict(zip(("seq", "ts", "type", "subject", "data", "prev", "hash"), event.fields(), strict=True))
    return json.dumps({**record, "seq": event.seq, "entry_id": event.entry_id}, separators=(",", ":")) + "\n"


def decode(line: str) -> dict[str, Any]:
    """The fields of one archive line; an empty mapping for a line that is not a JSON object (it is malformed)."""
    try:
        record = json.loads(line)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


class SegmentWriter:
    """Events ``first``..``last`` in order, to a temporary file that ``ArchiveFiles.segment`` commits."""

    def __init__(self, out: IO[str], path: Path, first: int, last: int) -> None:
        self._out = out
        self.path = path
        """Where the segment is committed."""
        self.first, self.last = first, last
        self.next = first

    def add(self, event: AuditEvent) -> None:
        if event.seq != self.next or event.seq > self.last:
            raise ValueError(f"segment {self.first}-{self.last} expects event {self.next}, got {event.seq}")
        self._out.write(encode(event))
        self.next += 1


class ArchiveFiles:
    """The segment files of one archive folder (created on first write)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def segments(self) -> list[Path]:
        """Every committed segment, by first seq."""
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.iterdir() if p.suffix == SUFFIX and not p.name.startswith("."))

    def records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(``file:line``, fields) of every archived event, oldest first."""
        for path in self.segments():
            with path.open(encoding="ascii", errors="replace") as lines:
                for number, line in enumerate(lines, 1):
                    yield f"{path.name}:{number}", decode(line)

    def last(self) -> AuditEvent | None:
        """The last archived event; None for an empty archive. ``ValueError`` when that line cannot be read."""
        segments = self.segments()
        if not segments:
            return None
        record = decode(_last_line(segments[-1]))
        return AuditEvent.from_fields(str(record.get("entry_id", "")), record)

    def tail(self, n: int) -> list[AuditEvent]:
        """The last ``n`` archived events, oldest first; lines that cannot be read are skipped."""
        if n <= 0:
            return []
        collected: list[AuditEvent] = []
        for path in reversed(self.segments()):
            events: deque[AuditEvent] = deque(maxlen=n)
            with path.open(encoding="ascii", errors="replace") as lines:
                for line in lines:
                    record = decode(line)
                    with contextlib.suppress(KeyError, ValueError):
                        events.append(AuditEvent.from_fields(str(record.get("entry_id", "")), record))
            collected = list(events) + collected
            if len(collected) >= n:
                break
        return collected[-n:]

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the folder's lock for one archive run; ``Conflict`` when another run or a reader holds it."""
        import fcntl

        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / LOCK).open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise Conflict(f"the audit archive is in use (an archive run or a verify): {self.directory}") from exc
            try:
                for stale in self.directory.glob(f".*{TEMPORARY}"):  # left by a run that crashed
                    stale.unlink()
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Keep archive runs out while the archive and then the stream are read as one chain (a run would
        move events from the stream into a segment already passed); waits for a run in progress."""
        import fcntl

        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / LOCK).open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def segment(self, first: int, last: int) -> Iterator[SegmentWriter]:
        """Write events ``first``..``last``: committed when the block ends with all of them, else discarded.

        ``Conflict`` when a segment of that name exists already.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / segment_name(first, last)
        partial = self.directory / f".{final.name}{TEMPORARY}"
        try:
            with partial.open("w", encoding="ascii") as out:
                writer = SegmentWriter(out, final, first, last)
                yield writer
                if writer.next != last + 1:
                    raise ValueError(f"segment {first}-{last} ends at event {writer.next - 1}")
                out.flush()
                os.fsync(out.fileno())
            try:
                os.link(partial, final)
            except FileExistsError as exc:
                raise Conflict(f"audit archive segment {final} exists already") from exc
            _fsync_directory(self.directory)
        finally:
            partial.unlink(missing_ok=True)


def _last_line(path: Path) -> str:
    with path.open("rb") as file:
        end = file.seek(0, os.SEEK_END)
        size = 4096
        while True:
            start = max(0, end - size)
            file.seek(start)
            chunk = file.read(end - start).rstrip(b"\n")
            if b"\n" in chunk or start == 0:
                return chunk.rsplit(b"\n", 1)[-1].decode("ascii", errors="replace")
            size *= 4


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
