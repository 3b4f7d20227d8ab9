"""The hash-chained audit trail on a Redis stream: events, their encoding, the atomic append, checkpoints.

Keys::

    examlops:audit:events   stream, one entry per event, fields seq ts type subject data prev hash
    examlops:audit:head     hash {seq, hash}: the last event; absent = empty chain (seq 0, GENESIS)

An event's ``hash`` is the hex sha256 of the canonical JSON array
``["examlops.audit.v1", seq, ts, type, subject, data, prev]`` where ``seq`` is an
integer and every other element is the exact string stored in the stream
(``ts`` is UNIX seconds formatted ``%.6f``; ``data`` is canonical JSON: sorted
keys, no spaces, UTF-8, no NaN; events written before 2026-11-29 escaped
non-ASCII, and verify as stored). ``prev`` is the previous event's hash,
``GENESIS`` (64 zeros) for seq 1.

Appends are one Lua script, a compare-and-set on the head: the client computes
the hashes for the head it last saw; the script writes the events and moves
the head only if the head is still that one, else it returns the current head
and the client recomputes. Concurrent appenders therefore never fork the
chain (two round trips, a read then a write, forked half the events of 8
writers here). The same script writes each event's optional side write (the
drift snapshot) with it, and makes appends idempotent: an entry may carry a
*once key* (a retrain request's), checked and set inside the script, and a
whole call a *call key* (a recorder batch's), so that a retry after a lost
reply writes nothing twice.

Signed checkpoints (``audit_store``) are written every ``checkpoint_every``
events (the seqs that are multiples of it) and every ``checkpoint_interval_s``.
Reading the trail back (``tail``, ``verify``) is ``audit_verify``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis

from examlops.adapters.redis import run_script, translated
from examlops.core.errors import Conflict
from examlops.core.jsoncodec import ascii_array
from examlops.core.jsoncodec import canonical as canonical_json  # the event data as stored and hashed
from examlops.monitoring.audit_store import CheckpointStore, new_checkpoint

log = logging.getLogger(__name__)

FORMAT = "examlops.audit.v1"
STREAM = "examlops:audit:events"
HEAD = "examlops:audit:head"
GENESIS = "0" * 64
FIELDS = ("seq", "ts", "type", "subject", "data", "prev", "hash")
MAX_CAS_ATTEMPTS = 1000

# Event types. Control actions are appended by whoever performs them (serving, flows, the CLI).
INFERENCE_SERVED = "inference.served"
TRAFFIC_CHANGED = "traffic.changed"
ALIAS_MOVED = "alias.moved"
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
    def from_fields(cls, entry_id: str, fields: Mapping[str, str]) -> AuditEvent:
        """``ValueError`` (or ``KeyError``) for an entry that lacks a field or has a non-integer seq."""
        f = fields
        return cls(int(f["seq"]), f["ts"], f["type"], f["subject"], f["data"], f["prev"], f["hash"], entry_id)

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


class AuditTrail:
    """Appends to the chain and checkpoints it. Thread-safe; every Redis error is ``StoreUnavailable``.

    ``append_many`` is all or nothing per call: when it raises, nothing of that call was written, or all
    of it was and a retry finds every once key set (so retrying with once keys never writes twice).
    A checkpoint that cannot be written to SQL is kept and tried again after the next append or ``tick``.
    """

    def __init__(
        self,
        client: redis.Redis,
        secret: bytes,
        checkpoints: CheckpointStore | None = None,
        *,
        checkpoint_every: int = 1000,
        checkpoint_interval_s: float = 60.0,
        once_ttl_s: float = 4200.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.redis = client
        self._script = client.register_script(APPEND_SCRIPT)
        self._secret = secret
        self._checkpoints = checkpoints
        self.checkpoint_every = checkpoint_every
        self.checkpoint_interval_s = checkpoint_interval_s
        self._once_ttl_ms = int(once_ttl_s * 1000)
        self._tries: dict[str, list[tuple[int, list[str]]]] = {}
        """Per call key not yet answered 'ok' or 'done', the (seq, hashes) of each try: one of them may have
        been written with its answer lost."""
        self._clock = clock
        self._lock = threading.Lock()
        self._head: tuple[int, str] | None = None
        self._last_written: tuple[int, str] | None = None
        self._due: dict[int, str] = {}
        self._checkpointed_at = clock()
        self._checkpoint_failing = False
        self.contended = 0
        """How many appends found the head moved by another appender and were recomputed."""

    def append(self, type: str, subject: str, data: Mapping[str, Any], *, once_key: str = "") -> AuditEvent | None:
        """Append one event now; None when ``once_key`` was already set (the event exists)."""
        return self.append_many([Entry(type, subject, data, self._clock(), once_key)])[0]

    def append_many(self, entries: Sequence[Entry], *, call_key: str = "") -> list[AuditEvent | None]:
        """Append in order, one script call; the result lines up with ``entries`` (None for a duplicate).

        ``call_key`` makes the whole call idempotent without a once key per entry: it is set (for the
        trail's once TTL, whatever the entries' own) by the script that writes the entries, and a call
        that finds it set writes nothing and returns None for every entry. A caller retrying after an
        error whose outcome it cannot know (the script ran, its reply was lost) passes the same key again.
        """
        if not entries:
            return []
        names: tuple[str, ...] = ()
        for entry in entries:
            if entry.side is not None:
                if names and entry.side.names != names:
                    raise ValueError(f"side writes of one append differ in their fields: {names} / {entry.side.names}")
                names = names or entry.side.names
        ttl_ms = max(self._once_ttl_ms if e.once_ttl_s is None else int(e.once_ttl_s * 1000) for e in entries)
        rows = [entry.row() for entry in entries]
        written = self._append(rows, names, ttl_ms, call_key)
        return [
            None if w is None else AuditEvent(w[0], row[5], row[6], row[7], row[8], w[1], w[2])
            for row, w in zip(rows, written, strict=True)
        ]

    def append_rows(self, rows: Sequence[Row], names: tuple[str, ...], *, call_key: str = "") -> int:
        """``append_many`` for entries already encoded (``Row``), whose side writes have the fields ``names``.

        The recorder's path: no ``Entry``, ``SideWrite`` or ``AuditEvent`` object per job. Once keys and
        ``call_key`` live for the trail's once TTL. Returns how many rows this call wrote (0 for duplicates,
        and when an earlier try with the same ``call_key`` had written them).
        """
        return sum(written is not None for written in self._append(rows, names, self._once_ttl_ms, call_key))

    def _append(
        self, rows: Sequence[Row], names: tuple[str, ...], ttl_ms: int, call_key: str
    ) -> list[tuple[int, str, str] | None]:
        """The compare-and-set loop: (seq, prev, hash) of each row written, None for a duplicate."""
        results: list[tuple[int, str, str] | None] = [None] * len(rows)
        seen: set[str] = set()
        todo: list[int] = []
        for index, row in enumerate(rows):
            once = row[0]
            if once:
                if once in seen:
                    continue
                seen.add(once)
            todo.append(index)
        with self._lock, translated("appending to the audit trail"):
            for _ in range(MAX_CAS_ATTEMPTS):
                if not todo:
                    return results
                if self._head is None:  # kept: a retry after a lost answer hashes against the same head
                    self._head = self._read_head()
                seq, head = self._head
                hashes, args = self._encode(seq, head, [rows[i] for i in todo], names, ttl_ms, call_key)
                if call_key:  # what this try writes, should its answer be lost (see 'done')
                    self._tries.setdefault(call_key, []).append((seq, hashes))
                reply: Any = run_script(self._script, [STREAM, HEAD], args)
                if reply[0] == "done":  # an earlier try of this call was written: nothing is written twice
                    self._head = (int(reply[1]), str(reply[2]))
                    # Every try was remembered before it ran; the key's value says which one wrote, and the
                    # checkpoints its events made due are kept.
                    for first, written in self._tries.pop(call_key, []):
                        if reply[3] == f"{first}:{written[-1]}":
                            self._written(first + 1, written)
                    return results
                if reply[0] == "ok":
                    self._tries.pop(call_key, None)
                    self._head = (int(reply[1]), str(reply[2]))
                    prev = head
                    for n, (index, hash) in enumerate(zip(todo, hashes, strict=True)):
                        results[index] = (seq + 1 + n, prev, hash)
                        prev = hash
                    self._written(seq + 1, hashes)
                    return results
                if reply[0] == "stale":
                    self.contended += 1
                    self._head = (int(reply[1]), str(reply[2]))
                    continue
                dups = {int(position) - 1 for position in reply[1:]}
                todo = [index for position, index in enumerate(todo) if position not in dups]
        raise Conflict(f"the audit head kept moving: gave up after {MAX_CAS_ATTEMPTS} attempts")

    def _read_head(self) -> tuple[int, str]:
        seq, head = self.redis.hmget(HEAD, ["seq", "hash"])
        return (int(seq), str(head)) if seq is not None else (0, GENESIS)

    def _encode(
        self, seq: int, head: str, rows: Sequence[Row], names: tuple[str, ...], ttl_ms: int, call_key: str
    ) -> tuple[list[str], list[str]]:
        """The rows' hashes, chained from (seq, head), and the append script's arguments."""
        k = len(names)
        args = [str(seq), head, str(max(1, ttl_ms)), str(len(rows)), call_key, str(self._once_ttl_ms), str(k), *names]
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

    # Checkpoints.

    def _written(self, first: int, hashes: Sequence[str]) -> None:
        """Note the events seq ``first`` onwards, hashed ``hashes``: every ``checkpoint_every``-th is due."""
        every, last = self.checkpoint_every, first + len(hashes) - 1
        for seq in range(-(-first // every) * every, last + 1, every):
            self._due[seq] = hashes[seq - first]
        self._last_written = (last, hashes[-1])
        if self._clock() - self._checkpointed_at >= self.checkpoint_interval_s:
            self._due[last] = hashes[-1]
        self._flush_checkpoints()

    def tick(self) -> None:
        """Checkpoint the last event this trail wrote when ``checkpoint_interval_s`` has passed; call when idle."""
        with self._lock:
            if self._last_written is not None and self._clock() - self._checkpointed_at >= self.checkpoint_interval_s:
                self._due.setdefault(*self._last_written)
            self._flush_checkpoints()

    def checkpoint_now(self) -> None:
        """Checkpoint the last event this trail wrote (on close)."""
        with self._lock:
            if self._last_written is not None:
                self._due.setdefault(*self._last_written)
            self._flush_checkpoints()

    def _flush_checkpoints(self) -> None:
        if self._checkpoints is None or not self._due:
            self._due.clear()
            return
        for seq in sorted(self._due):
            try:
                self._checkpoints.save(new_checkpoint(self._secret, seq, self._due[seq], self._clock()))
            except Exception as exc:
                if not self._checkpoint_failing:
                    log.warning("cannot write audit checkpoint %d (%s); will retry", seq, exc)
                self._checkpoint_failing = True
                return
            del self._due[seq]
            self._checkpointed_at = self._clock()
        if self._checkpoint_failing:
            log.warning("audit checkpoints are written again")
        self._checkpoint_failing = False
