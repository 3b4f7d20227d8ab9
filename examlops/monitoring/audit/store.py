"""The audit chain in Redis: the append and archive-trim scripts, and ``RedisAuditStore``, their adapter.

Keys::

    examlops:audit:events     stream, one entry per event, fields seq ts type subject data prev hash
    examlops:audit:head       hash {seq, hash}: the last event; absent = empty chain (seq 0, GENESIS)
    examlops:audit:archived   hash {seq, hash, entry_id}: the last event moved to the archive; absent = none

Appends are one Lua script, a compare-and-set on the head: the client hashes
the events against the head it last saw; the script writes them and moves the
head only if the head is still that one, else it answers the current head and
the client hashes again, so concurrent appenders never fork the chain. The
script also writes each event's optional side write (the drift snapshot),
checks and sets per-event *once keys* and a per-call *call key*, all or nothing.

The archive trim is one script too: it checks that the last archived event is
still in the stream as archived and that no other archiver moved the
watermark, then ``XTRIM MINID`` just past it and moves the watermark. Appends
only ever add entries after the newest id, so the trim never touches one.

Every redis-py connection error becomes ``StoreUnavailable`` (``adapters.redis.translated``); scripts run
through redis-py's ``Script``, which loads a script again after a Redis restart.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from examlops.adapters.redis import translated
from examlops.core.errors import Conflict
from examlops.monitoring.audit.chain import GENESIS, Row, event_hash

STREAM = "examlops:audit:events"
HEAD = "examlops:audit:head"
ARCHIVED = "examlops:audit:archived"

APPEND_SCRIPT = """
-- KEYS: audit stream, head hash. ARGV: expected seq, expected hash, once ttl (ms), event count, call key
-- ('' = none), call key ttl (ms), side field count k, the k side field names, index count p, p (index set,
-- member) pairs, then per event: once key, side stream ('' = none), the k side values when there is a side
-- stream, ts, type, subject, data, hash. The script numbers the events from the head and chains their prev;
-- the client hashed them the same way. All or nothing: 'done' + the head + the call key's value ('<seq
-- before the call>:<hash of its last event>') when the call key exists (this call was written before),
-- 'stale' + the head when it moved, 'dup' + the 1-based positions whose once key exists.
local head = redis.call('HMGET', KEYS[2], 'seq', 'hash')
local seq, prev = head[1], head[2]
if not seq then seq, prev = '0', string.rep('0', 64) end
local done = ARGV[5] ~= '' and redis.call('GET', ARGV[5])
if done then return {'done', seq, prev, done} end
if seq ~= ARGV[1] or prev ~= ARGV[2] then return {'stale', seq, prev} end
local k = tonumber(ARGV[7])
local p = tonumber(ARGV[8 + k])
local starts, dups, i = {}, {}, 9 + k + 2 * p
for e = 1, tonumber(ARGV[4]) do
  starts[e] = i
  if ARGV[i] ~= '' and redis.call('EXISTS', ARGV[i]) == 1 then dups[#dups + 1] = tostring(e) end
  if ARGV[i + 1] ~= '' then i = i + k end
  i = i + 7
end
if #dups > 0 then return {'dup', unpack(dups)} end
local side, n = {}, tonumber(seq)
for j = 1, k do side[2 * j - 1] = ARGV[7 + j] end
for _, a in ipairs(starts) do
  local once, stream = ARGV[a], ARGV[a + 1]
  if stream ~= '' then
    for j = 1, k do side[2 * j] = ARGV[a + 1 + j] end
    redis.call('XADD', stream, '*', unpack(side))
    a = a + k
  end
  n = n + 1
  redis.call('XADD', KEYS[1], '*', 'seq', tostring(n), 'ts', ARGV[a + 2], 'type', ARGV[a + 3],
             'subject', ARGV[a + 4], 'data', ARGV[a + 5], 'prev', prev, 'hash', ARGV[a + 6])
  prev = ARGV[a + 6]
  if once ~= '' then redis.call('SET', once, '1', 'PX', ARGV[3]) end
end
for j = 0, p - 1 do redis.call('SADD', ARGV[9 + k + 2 * j], ARGV[10 + k + 2 * j]) end
if ARGV[5] ~= '' then redis.call('SET', ARGV[5], ARGV[1] .. ':' .. prev, 'PX', ARGV[6]) end
redis.call('HSET', KEYS[2], 'seq', tostring(n), 'hash', prev)
return {'ok', tostring(n), prev}
"""

TRIM_SCRIPT = """
-- KEYS: audit stream, archived hash. ARGV: the archived seq the caller read ('0' = none), the new last
-- archived seq, its hash, its entry id. 'done' when the watermark is already there, 'moved' + the watermark
-- when another archiver moved it, 'changed' when the entry is not that event; else trims every entry up
-- to and including it, moves the watermark and answers 'ok' + how many entries went.
local current = redis.call('HGET', KEYS[2], 'seq') or '0'
if current == ARGV[2] then return {'done', '0'} end
if current ~= ARGV[1] then return {'moved', current} end
local found = redis.call('XRANGE', KEYS[1], ARGV[4], ARGV[4])
if #found == 0 then return {'changed', '0'} end
local seq, hash, fields = nil, nil, found[1][2]
for i = 1, #fields, 2 do
  if fields[i] == 'seq' then seq = fields[i + 1] elseif fields[i] == 'hash' then hash = fields[i + 1] end
end
if seq ~= ARGV[2] or hash ~= ARGV[3] then return {'changed', '0'} end
local ms, sq = string.match(ARGV[4], '^(%d+)-(%d+)$')
local trimmed = redis.call('XTRIM', KEYS[1], 'MINID', ms .. '-' .. string.format('%d', tonumber(sq) + 1))
redis.call('HSET', KEYS[2], 'seq', ARGV[2], 'hash', ARGV[3], 'entry_id', ARGV[4])
return {'ok', tostring(trimmed)}
"""


@dataclass(frozen=True, slots=True)
class AppendReply:
    """The append script's answer: ``kind`` is ``ok``, ``done``, ``stale`` or ``dup``.

    ``seq``/``hash``: the head after the call (all but ``dup``); ``done``: the call key's value;
    ``dups``: the 0-based positions whose once key exists.
    """

    kind: str
    seq: int = 0
    hash: str = ""
    done: str = ""
    dups: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Watermark:
    """The last event moved to the archive, as Redis records it."""

    seq: int
    hash: str
    entry_id: str


def encode_append(
    seq: int, head: str, rows: Sequence[Row], names: tuple[str, ...], ttl_ms: int, call_key: str, call_ttl_ms: int
) -> tuple[list[str], list[str]]:
    """The rows' hashes, chained from (seq, head), and the append script's arguments.

    ``ValueError`` when a side write's values do not match ``names``.
    """
    k = len(names)
    args = [str(seq), head, str(max(1, ttl_ms)), str(len(rows)), call_key, str(max(1, call_ttl_ms)), str(k), *names]
    indexes: dict[tuple[str, str], None] = {}
    body: list[str] = []
    hashes: list[str] = []
    for once, stream, values, index, member, ts, type, subject, data in rows:
        seq += 1
        head = event_hash(seq, ts, type, subject, data, head)
        hashes.append(head)
        if stream:
            if not k or len(values) != k:
                raise ValueError(f"a side write has {len(values)} values for {k} fields")
            if index:
                indexes[index, member] = None
            body += (once, stream, *values, ts, type, subject, data, head)
        else:
            body += (once, "", ts, type, subject, data, head)
    args.append(str(len(indexes)))
    for pair in indexes:
        args += pair
    args += body
    return hashes, args


class RedisAuditStore:
    """The chain's stream, head and archive watermark on one redis-py client (decoded strings)."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._append = client.register_script(APPEND_SCRIPT)
        self._trim = client.register_script(TRIM_SCRIPT)

    def head(self) -> tuple[int, str]:
        """(seq, hash) of the last event; (0, GENESIS) for an empty chain."""
        with translated("reading the audit head"):
            found: Any = self.redis.hmget(HEAD, ["seq", "hash"])
        seq, head = found
        return (int(seq), str(head)) if seq is not None else (0, GENESIS)

    def append(self, args: Sequence[str]) -> AppendReply:
        """Run the append script with ``encode_append``'s arguments."""
        with translated("appending to the audit trail"):
            reply: Any = self._append(keys=[STREAM, HEAD], args=list(args))
        kind = str(reply[0])
        if kind == "dup":
            return AppendReply(kind, dups=tuple(int(position) - 1 for position in reply[1:]))
        return AppendReply(kind, int(reply[1]), str(reply[2]), str(reply[3]) if kind == "done" else "")

    def entries(self, page: int = 1000) -> Iterator[tuple[str, dict[str, str]]]:
        """Every stream entry, oldest first, read ``page`` at a time."""
        start = "-"
        while True:
            with translated("reading the audit trail"):
                found: Any = self.redis.xrange(STREAM, min=start, count=page)
            yield from found
            if len(found) < page:
                return
            start = "(" + found[-1][0]

    def last(self, n: int) -> list[tuple[str, dict[str, str]]]:
        """The last ``n`` stream entries, oldest first."""
        with translated("reading the audit trail"):
            found: Any = self.redis.xrevrange(STREAM, count=n) if n > 0 else []
        return list(reversed(found))

    def watermark(self) -> Watermark | None:
        with translated("reading the audit archive watermark"):
            found: Any = self.redis.hgetall(ARCHIVED)
        if not found:
            return None
        return Watermark(int(found["seq"]), str(found["hash"]), str(found["entry_id"]))

    def trim_archived(self, expected: int, last: Watermark) -> int:
        """Trim the stream up to and including ``last`` and record it as archived; how many entries went.

        ``expected`` is the watermark's seq as the caller read it (0 for none). ``Conflict`` when another
        archiver moved the watermark or the entry is no longer the event archived; 0 when already done.
        """
        with translated("trimming the archived audit events"):
            reply: Any = self._trim(
                keys=[STREAM, ARCHIVED], args=[str(expected), str(last.seq), last.hash, last.entry_id]
            )
        kind = str(reply[0])
        if kind == "moved":
            raise Conflict(f"another archiver moved the audit archive watermark to event {reply[1]}")
        if kind == "changed":
            raise Conflict(f"audit event {last.seq} ({last.entry_id}) is no longer in the stream as archived")
        return int(reply[1])
