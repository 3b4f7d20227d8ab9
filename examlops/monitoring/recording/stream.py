"""The records stream as a recorder sees it: the ``RecordStream`` port and its Redis adapter.

Keys::

    examlops:records             stream of served records (``core.records``); consumer group ``recorders``
    examlops:records:dropped     counter of records the bridges did not add (the stream held its bound)
    examlops:recorded:{entry id} set (by the audit append) when a record's event is written; kept
                                 ``settled_keep_s`` once the record is settled (a recorder that stalled past
                                 the reclaim idle time and wakes up after another settled its batch finds it
                                 and writes nothing twice); 4200 s when its recorder died in between

``RedisRecordStream`` raises ``StoreUnavailable`` when Redis cannot be reached; a record entry that
cannot be read comes back as None in place of its record (its caller settles it as dropped).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import redis
from redis.exceptions import ResponseError

from examlops.adapters.redis import translated
from examlops.core.records import RECORDERS_GROUP, RECORDS_DROPPED, RECORDS_STREAM, ServedInference, read_record

WRITTEN_PREFIX = "examlops:recorded:"
STALE_CONSUMER_S = 3600.0
"""A recorder consumer holding nothing and idle this long (its bridge is gone) is removed from the group."""

SETTLE_SCRIPT = """
-- KEYS: records stream. ARGV: group, once key prefix, keep ms, entry ids... Acknowledges and deletes the
-- entries and shortens their once keys' lives to the keep time, in one step. Sent again after a lost reply,
-- it changes nothing.
local ids = {unpack(ARGV, 4)}
for i = 1, #ids, 1000 do
  local chunk = {unpack(ids, i, math.min(i + 999, #ids))}
  redis.call('XACK', KEYS[1], ARGV[1], unpack(chunk))
  redis.call('XDEL', KEYS[1], unpack(chunk))
  for j = 1, #chunk do redis.call('PEXPIRE', ARGV[2] .. chunk[j], ARGV[3]) end
end
return #ids
"""

Read = list[tuple[str, ServedInference | None]]
"""(entry id, its record or None when the entry cannot be read), in stream order."""


def written_key(entry_id: str) -> str:
    """The once key of one record's audit event: set by the write, kept a while after the record is settled."""
    return WRITTEN_PREFIX + entry_id


class RecordStream(Protocol):
    """Where a recorder takes records from. Every method may raise ``StoreUnavailable``."""

    def ensure_group(self) -> None: ...

    def read(self, consumer: str, count: int, block_ms: int | None, *, own: bool = False) -> Read:
        """New records for ``consumer`` (waits up to ``block_ms``; None: not at all); ``own``: the records
        delivered to ``consumer`` before and not settled (a previous run of it died), from the start."""

    def claim(self, consumer: str, min_idle_s: float, count: int) -> Read:
        """Records another consumer read and left unsettled for ``min_idle_s`` (it died): now ``consumer``'s."""

    def written_among(self, entry_ids: Sequence[str]) -> set[str]:
        """Those of ``entry_ids`` whose audit event was written (by a recorder that died before settling)."""

    def settle(self, entry_ids: Sequence[str]) -> None:
        """Done with these records: acknowledged, deleted from the stream, their once keys kept a while."""

    def dropped(self) -> int:
        """Records the bridges could not add since the stream was created (it held its bound)."""

    def prune(self, consumer: str) -> int:
        """Remove stale consumers (no records held, idle ``STALE_CONSUMER_S``) other than ``consumer``."""


class RedisRecordStream:
    """``RecordStream`` on a sync redis-py client (decoded strings).

    ``settled_keep_s``: how long a settled record's once key stays; bootstrap gives three reclaim idle times.
    """

    def __init__(self, client: redis.Redis, *, settled_keep_s: float = 180.0) -> None:
        self.redis = client
        self.settled_keep_ms = max(1, int(settled_keep_s * 1000))
        self._settle = client.register_script(SETTLE_SCRIPT)

    def ensure_group(self) -> None:
        with translated("creating the recorders group"):
            try:
                self.redis.xgroup_create(RECORDS_STREAM, RECORDERS_GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def read(self, consumer: str, count: int, block_ms: int | None, *, own: bool = False) -> Read:
        with translated("reading records"):
            found: Any = self.redis.xreadgroup(
                RECORDERS_GROUP, consumer, {RECORDS_STREAM: "0" if own else ">"}, count=count, block=block_ms
            )
        return _records([entry for _name, entries in found or [] for entry in entries])

    def claim(self, consumer: str, min_idle_s: float, count: int) -> Read:
        with translated("reclaiming records"):
            reply: Any = self.redis.xautoclaim(
                RECORDS_STREAM, RECORDERS_GROUP, consumer, int(min_idle_s * 1000), "0-0", count=count
            )
        return _records(reply[1])

    def written_among(self, entry_ids: Sequence[str]) -> set[str]:
        if not entry_ids:
            return set()
        with translated("checking written records"):
            found: Any = self.redis.mget([written_key(entry_id) for entry_id in entry_ids])
        return {entry_id for entry_id, value in zip(entry_ids, found, strict=True) if value is not None}

    def settle(self, entry_ids: Sequence[str]) -> None:
        if not entry_ids:
            return
        with translated("settling records"):
            self._settle(
                keys=[RECORDS_STREAM], args=[RECORDERS_GROUP, WRITTEN_PREFIX, self.settled_keep_ms, *entry_ids]
            )

    def dropped(self) -> int:
        with translated("reading the dropped records count"):
            value: Any = self.redis.get(RECORDS_DROPPED)
        return int(value or 0)

    def prune(self, consumer: str) -> int:
        removed = 0
        with translated("pruning recorder consumers"):
            consumers: Any = self.redis.xinfo_consumers(RECORDS_STREAM, RECORDERS_GROUP)
            for info in consumers:
                name = str(info["name"])
                if name != consumer and int(info["pending"]) == 0 and int(info["idle"]) >= STALE_CONSUMER_S * 1000:
                    removed += int(self.redis.xgroup_delconsumer(RECORDS_STREAM, RECORDERS_GROUP, name))
        return removed


def _records(entries: Sequence[Any]) -> Read:
    """(id, record) per entry; None for one that cannot be read (or was deleted: its fields are nil).

    Redis 6.2's XAUTOCLAIM names no id for a deleted entry (redis-py gives ``(None, None)``): skipped.
    """
    found: Read = []
    for entry in entries:
        if entry is None or entry[0] is None:
            continue
        entry_id, fields = entry
        try:
            found.append((entry_id, read_record(entry_id, fields or {})))
        except ValueError:
            found.append((entry_id, None))
    return found
