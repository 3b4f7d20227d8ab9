"""``AuditTrail``: appends to the hash-chained audit trail and signs checkpoints of it.

Appends go through ``store.RedisAuditStore`` (one compare-and-set script per
call). Every call carries a *call key*, the caller's or one of its own, set by
the script that writes the call: when a reply is lost after the script ran and
the call is sent again (by redis-py's connection retry, or by the caller with
the same key), the script answers ``done`` and nothing is written twice.

Signed checkpoints (``checkpoints``) are written for the seqs that are
multiples of ``checkpoint_every`` and every ``checkpoint_interval_s``; an
appender only signs events it wrote. A checkpoint that cannot be written to
SQL is kept and tried again after the next append or ``tick``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis

from examlops.core.errors import Conflict
from examlops.monitoring.audit.chain import AuditEvent, Entry, Row
from examlops.monitoring.audit.checkpoints import CheckpointStore, new_checkpoint
from examlops.monitoring.audit.store import RedisAuditStore, encode_append

log = logging.getLogger(__name__)

MAX_CAS_ATTEMPTS = 1000
OWN_CALL_KEY_PREFIX = "examlops:audit:call:"
OWN_CALL_KEY_TTL_MS = 120_000
"""A call key of the trail's own only has to outlive the connection retries of one call."""

Written = tuple[int, str, str]
"""(seq, prev, hash) of one event written."""


class AuditTrail:
    """Appends to the chain and checkpoints it. Thread-safe; every Redis error is ``StoreUnavailable``.

    ``append_many`` is all or nothing per call: when it raises, nothing of that call was written, or all
    of it was and a retry finds every once key set (so retrying with once keys never writes twice).
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
        self.store = RedisAuditStore(client)
        self._secret = secret
        self._checkpoints = checkpoints
        self.checkpoint_every = checkpoint_every
        self.checkpoint_interval_s = checkpoint_interval_s
        self._once_ttl_ms = int(once_ttl_s * 1000)
        self._tries: dict[str, list[tuple[int, str, list[str], list[int]]]] = {}
        """Per call key not yet answered 'ok' or 'done', the (seq, head hash, hashes, row positions) of each try:
        one of them may have been written with its answer lost."""
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
        trail's once TTL, whatever the entries' own) by the script that writes the entries, and a later
        call that finds it set writes nothing and returns None for every entry. A caller retrying after an
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
        and when an earlier call with the same ``call_key`` had written them).
        """
        return sum(written is not None for written in self._append(rows, names, self._once_ttl_ms, call_key))

    def _append(self, rows: Sequence[Row], names: tuple[str, ...], ttl_ms: int, call_key: str) -> list[Written | None]:
        """The compare-and-set loop: (seq, prev, hash) of each row written, None for a duplicate."""
        results: list[Written | None] = [None] * len(rows)
        seen: set[str] = set()
        todo: list[int] = []
        for index, row in enumerate(rows):
            once = row[0]
            if once:
                if once in seen:
                    continue
                seen.add(once)
            todo.append(index)
        own = not call_key
        key = call_key or OWN_CALL_KEY_PREFIX + uuid.uuid4().hex
        with self._lock:
            earlier = len(self._tries.get(key, []))
            try:
                for _ in range(MAX_CAS_ATTEMPTS):
                    if not todo:
                        return results
                    if self._head is None:  # kept: a retry after a lost answer hashes against the same head
                        self._head = self.store.head()
                    seq, head = self._head
                    call_ttl = OWN_CALL_KEY_TTL_MS if own else self._once_ttl_ms
                    hashes, args = encode_append(seq, head, [rows[i] for i in todo], names, ttl_ms, key, call_ttl)
                    self._tries.setdefault(key, []).append((seq, head, hashes, todo))  # should its answer be lost
                    reply = self.store.append(args)
                    if reply.kind == "done":  # a try of this call was written: nothing is written twice
                        self._head = (reply.seq, reply.hash)
                        for n, (first, base, written, positions) in enumerate(self._tries.pop(key, [])):
                            if reply.done == f"{first}:{written[-1]}":
                                self._written(first + 1, written)
                                if n >= earlier:  # written by this call: its events are its results
                                    self._fill(results, positions, first, base, written)
                        return results
                    if reply.kind == "ok":
                        self._tries.pop(key, None)
                        self._head = (reply.seq, reply.hash)
                        self._fill(results, todo, seq, head, hashes)
                        self._written(seq + 1, hashes)
                        return results
                    if reply.kind == "stale":
                        self.contended += 1
                        self._head = (reply.seq, reply.hash)
                        continue
                    todo = [index for position, index in enumerate(todo) if position not in reply.dups]
            finally:
                if own:
                    self._tries.pop(key, None)
        raise Conflict(f"the audit head kept moving: gave up after {MAX_CAS_ATTEMPTS} attempts")

    @staticmethod
    def _fill(
        results: list[Written | None], positions: Sequence[int], seq: int, prev: str, hashes: Sequence[str]
    ) -> None:
        """Mark the rows at ``positions`` written as events ``seq + 1``.. with ``hashes``, chained from ``prev``."""
        for n, (index, hash) in enumerate(zip(positions, hashes, strict=True)):
            results[index] = (seq + 1 + n, prev, hash)
            prev = hash

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
