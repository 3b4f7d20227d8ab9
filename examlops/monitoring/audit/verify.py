"""Reading the audit trail back: the last events (``tail``) and ``verify``, archive and stream as one chain.

``verify`` checks every event's hash and link from seq 1 (the archive's
segments, then the Redis stream), and the chain against the signed checkpoints
in SQL, the head in Redis and the archive watermark, so that it catches an
edited field, a deleted event, reordered events, a truncated tail, a suffix
rewritten with recomputed hashes, a rollback to an older copy, and archive
files edited or gone. Redis and SQL errors are ``StoreUnavailable``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from examlops.monitoring.audit.chain import AuditEvent
from examlops.monitoring.audit.checkpoints import CheckpointStore, checkpoint_is_genuine
from examlops.monitoring.audit.segments import ArchiveFiles
from examlops.monitoring.audit.store import RedisAuditStore, Watermark
from examlops.monitoring.audit.walk import BrokenLink, ChainWalk


class ChainSource(Protocol):
    """Where the live part of the chain is read from (``RedisAuditStore``); ``StoreUnavailable``."""

    def head(self) -> tuple[int, str]: ...
    def watermark(self) -> Watermark | None: ...
    def entries(self, page: int = 1000) -> Iterator[tuple[str, dict[str, str]]]: ...
    def last(self, n: int) -> list[tuple[str, dict[str, str]]]: ...


def _source(client: redis.Redis | ChainSource) -> ChainSource:
    return RedisAuditStore(client) if isinstance(client, redis.Redis) else client


def tail(client: redis.Redis | ChainSource, n: int, *, archive: ArchiveFiles | None = None) -> list[AuditEvent]:
    """The last ``n`` events, oldest first, from the archive too when the stream holds fewer.

    Entries that cannot be read are skipped.
    """
    events = []
    for entry_id, fields in _source(client).last(n):
        with contextlib.suppress(KeyError, ValueError):
            events.append(AuditEvent.from_fields(entry_id, fields))
    if archive is not None and len(events) < n:
        first = events[0].seq if events else None
        older = [e for e in archive.tail(n) if first is None or e.seq < first]
        events = older[max(0, len(older) - (n - len(events))) :] + events
    return events


@dataclass(frozen=True, slots=True)
class VerifyReport:
    events: int
    last_seq: int
    checkpoints: int
    broken: BrokenLink | None
    archived: int = 0
    """How many of ``events`` came from the archive."""

    @property
    def ok(self) -> bool:
        return self.broken is None

    def to_json(self) -> dict[str, Any]:
        broken = self.broken
        return {
            "ok": self.ok,
            "events": self.events,
            "archived": self.archived,
            "last_seq": self.last_seq,
            "checkpoints": self.checkpoints,
            "broken": None
            if broken is None
            else {"seq": broken.seq, "kind": broken.kind, "message": broken.message, "entry_id": broken.entry_id},
        }


def verify(
    client: redis.Redis | ChainSource,
    secret: bytes,
    checkpoints: CheckpointStore | None,
    page: int = 1000,
    *,
    archive: ArchiveFiles | None = None,
    seen: Callable[[AuditEvent], None] | None = None,
) -> VerifyReport:
    """Walk the chain from seq 1 (``archive`` first) and check it against the signed checkpoints; ``seen`` gets
    each event that verified, in order, up to the first broken link (``walk.ChainWalk``).

    Checkpoints, head and archive watermark are read before the events, so appends going on meanwhile
    never look like damage; archive runs of ``archive``'s folder wait (or are refused) until the walk is
    done. Of several problems, the one at the lowest seq is reported.
    """
    signed = checkpoints.all() if checkpoints is not None else []
    forged = [cp.seq for cp in signed if not checkpoint_is_genuine(secret, cp)]
    expected_at = {cp.seq: cp.head_hash for cp in signed if cp.seq not in forged}
    problems: list[BrokenLink] = []
    if forged:
        problems.append(BrokenLink(forged[0], "forged_checkpoint", f"the checkpoint at seq {forged[0]} is not signed"))
    store = _source(client)
    walk = ChainWalk(expected_at, seen)
    archive_intact = False
    with archive.reading() if archive is not None else contextlib.nullcontext():
        head_seq, head_hash = store.head()
        mark = store.watermark()
        for item in _chain(store, archive, page):
            if item is None:
                walk.end_archive()
                archive_intact = walk.first_problem is None
            elif not walk.step(*item):
                break
    if mark is not None and archive_intact and mark.seq > walk.archive_last:
        where = "no archive was given" if archive is None else f"the archive in {archive.directory}"
        problems.append(
            BrokenLink(
                walk.archive_last + 1,
                "deleted",
                f"Redis records events up to {mark.seq} as archived, but {where} ends at event {walk.archive_last}",
            )
        )
    problems += walk.problems()
    if head_seq and walk.hash_at_head(head_seq) not in (head_hash, None):
        problems.append(BrokenLink(head_seq, "rewritten", f"event {head_seq} is not the one the head names"))
    ends = [(cp, "a signed checkpoint") for cp in sorted(expected_at) if cp > walk.last]
    if head_seq > walk.last:
        ends.append((head_seq, "the head"))
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
    return VerifyReport(walk.count, walk.last, len(signed), broken, walk.archived)


def _chain(
    store: ChainSource, archive: ArchiveFiles | None, page: int
) -> Iterator[tuple[str, Mapping[str, Any]] | None]:
    """The archived records, None, then the stream's entries."""
    if archive is not None:
        yield from archive.records()
    yield None
    yield from store.entries(page)
