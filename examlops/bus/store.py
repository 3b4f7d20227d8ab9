"""``BusStore``: every Redis command the bus client and the bridge send, over one ``RedisCommands`` port.

The port answers raw RESP2 replies; this module turns them into the bus's
shapes. Its adapter is redis-py's (``adapters.redis.RedisPyCommands``, built by
``bootstrap.clients.bus_redis``), tested against a real redis-server
(``tests/integration/test_bus_store.py``).

Failure mode: an unreachable or restarting Redis is ``StoreUnavailable``
(``adapters.redis.translated``, after the adapter's connect retries), so the
loops above handle one error of ours; a command that was in flight may have
run, and each command here is safe to repeat (the scripts are idempotent by
job id and finish token). Other error replies are redis-py's
``ResponseError``. Scripts run by EVALSHA and are sent again to a restarted
Redis that forgot them. Blocking reads go through the port's ``wait``.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from redis.exceptions import ResponseError

from examlops.adapters.redis import LuaScript, RedisCommands, translated
from examlops.bus import scripts, wire
from examlops.core.jsoncodec import canonical
from examlops.core.records import RECORDS_DROPPED, RECORDS_STREAM

log = logging.getLogger(__name__)

Entry = tuple[str, str, dict[str, str]]
"""(stream, entry id, fields)."""


class BusStore:
    """The bus's commands over ``redis``, which the store owns: ``aclose`` closes it."""

    def __init__(self, redis: RedisCommands, *, reply_ttl_s: int = wire.REPLY_STREAM_TTL_S) -> None:
        self.redis = redis
        self.reply_ttl_s = reply_ttl_s
        self._finish = LuaScript(scripts.REPLY_SCRIPT)
        self._submit = LuaScript(scripts.SUBMIT_SCRIPT)
        self._prune = LuaScript(scripts.PRUNE_SCRIPT)
        self._resend = LuaScript(scripts.RESEND_SCRIPT)

    async def aclose(self) -> None:
        await self.redis.aclose()

    # The client's side.

    async def submit(self, address: str, fields: Mapping[str, str]) -> str:
        args: list[str | int] = [address, wire.JOB_STREAM_MAXLEN]
        for name, value in fields.items():
            args += [name, value]
        with translated("submitting a job"):
            entry: Any = await self.redis.evalsha(self._submit, [wire.jobs_stream(address), wire.ADDRESSES_KEY], args)
        return str(entry)

    async def replies(self, stream: str, after: str, block_ms: int) -> list[tuple[str, dict[str, str]]]:
        with translated("reading replies"):
            raw = await self.redis.wait("XREAD", "COUNT", 256, "BLOCK", block_ms, "STREAMS", stream, after)
        return [(entry_id, fields) for _name, entry_id, fields in _entries(raw)]

    # The bridge's side.

    async def ensure_groups(self, streams: Iterable[str]) -> None:
        """The group reads from the start of each stream: jobs sent before any bridge ran are served too."""
        with translated("creating consumer groups"):
            for stream in streams:
                try:
                    await self.redis.execute("XGROUP", "CREATE", stream, wire.GROUP, "0", "MKSTREAM")
                except ResponseError as exc:
                    if "BUSYGROUP" not in str(exc):
                        raise

    async def read(self, consumer: str, streams: Sequence[str], count: int, block_ms: int | None) -> list[Entry]:
        """New jobs for ``consumer``; waits up to ``block_ms`` for one (None: returns at once)."""
        wait: list[str | int] = [] if block_ms is None else ["BLOCK", block_ms]
        command = ["XREADGROUP", "GROUP", wire.GROUP, consumer, "COUNT", count, *wait, "STREAMS", *streams]
        command += [">"] * len(streams)
        with translated("reading jobs"):
            raw = await (self.redis.execute(*command) if block_ms is None else self.redis.wait(*command))
        return _entries(raw)

    async def done_among(self, job_ids: Sequence[str]) -> dict[str, str]:
        """The ids among ``job_ids`` whose reply was already written, each with its done key's value (where the
        reply is: ``wire.reply_location``): one MGET for a whole read, not one per job."""
        if not job_ids:
            return {}
        with translated("checking jobs"):
            found: Any = await self.redis.execute("MGET", *[wire.done_key(job_id) for job_id in job_ids])
        return {job_id: str(value) for job_id, value in zip(job_ids, found, strict=True) if value is not None}

    async def resend(
        self, stream: str, entry_id: str, *, reply: wire.DoneReply | None, reply_to: str, key_id: str
    ) -> bool:
        """A copy of an answered job: the job id's ``reply`` (``wire.reply_location`` of its done key; the caller
        checked the copy's digest and identity) goes to ``reply_to`` again, marked ``resent``, when it is still
        there and signed for ``key_id``; the copy is acked and deleted either way (None: only that). True when
        the reply was resent."""
        keys = [stream, reply.stream if reply else "", reply_to]
        args: list[str | int] = [wire.GROUP, entry_id, reply.entry_id if reply else "0-0", key_id]
        args += [wire.REPLY_STREAM_MAXLEN, self.reply_ttl_s]
        with translated("resending a reply"):
            return bool(await self.redis.evalsha(self._resend, keys, args))

    async def finish(
        self,
        stream: str,
        entry_id: str,
        *,
        done_id: str,
        reply_to: str | None,
        reply: Mapping[str, str],
        dead: Mapping[str, Any] | None = None,
        done_ttl_s: int = wire.DONE_TTL_S,
        token: str = "",
        record: str = "",
        records_bound: int = 0,
        digest: str = "",
    ) -> bool:
        """Reply (and dead-letter) once per ``done_id``, then XACK and XDEL the entry. True when this was the first.

        ``token`` names this finish (unique, the same on each of its retries): a retry after an answer that was
        lost on the way back (the script ran) is still told True. Without one, every retry is told False.
        ``record`` (``ServedInference.packed``) goes to the records stream with the reply, in the same step,
        unless the stream holds ``records_bound`` entries (then it is counted as dropped). ``digest``
        (``wire.Job.digest``) goes into the done key with the reply's place: a retry is resent only that reply,
        and only when it repeats the request (without one, the reply is never resent).
        """
        token = token or secrets.token_hex(8)
        keys = [stream, wire.done_key(done_id), reply_to or "", wire.DEAD_STREAM]
        keys += [RECORDS_STREAM if record else "", RECORDS_DROPPED]
        args: list[str | int] = [wire.GROUP, entry_id, done_ttl_s, wire.REPLY_STREAM_MAXLEN]
        args += [self.reply_ttl_s, wire.DEAD_STREAM_MAXLEN, "" if dead is None else canonical(dead), token]
        client = reply_to.removeprefix(wire.REPLIES_PREFIX) if reply_to else ""
        args += [record, records_bound, f"{digest}\n{client}" if digest and client else ""]
        for name, value in reply.items():
            args += [name, value]
        with translated("writing a reply"):
            return bool(await self.redis.evalsha(self._finish, keys, args))

    async def autoclaim(self, stream: str, consumer: str, min_idle_ms: int, count: int) -> list[Entry]:
        """Claim jobs idle for ``min_idle_ms`` (a dead bridge's); each claim counts one more delivery."""
        claimed: list[Entry] = []
        start = "0-0"
        with translated("reclaiming jobs"):
            while len(claimed) < count:
                reply: Any = await self.redis.execute(
                    "XAUTOCLAIM", stream, wire.GROUP, consumer, min_idle_ms, start, "COUNT", count
                )
                start = reply[0]
                claimed += [(stream, entry_id, fields) for _name, entry_id, fields in _entries([[stream, reply[1]]])]
                if start == "0-0":
                    break
        return claimed

    async def deliveries(self, stream: str, entry_id: str) -> int:
        with translated("counting deliveries"):
            pending: Any = await self.redis.execute("XPENDING", stream, wire.GROUP, entry_id, entry_id, 1)
        return int(pending[0][3]) if pending else 0  # [[id, consumer, idle ms, times delivered]]

    async def appendonly(self) -> str | None:
        """``CONFIG GET appendonly``: "yes", "no", or None when CONFIG is refused (managed Redis)."""
        with translated("reading the configuration"):
            try:
                config: Any = await self.redis.execute("CONFIG", "GET", "appendonly")
            except ResponseError:
                return None
        value = _pairs(config).get("appendonly")
        return None if value is None else str(value)

    async def heartbeat(self, addresses: Iterable[str], now: float) -> None:
        beats = [item for address in addresses for item in (address, repr(now))]
        if beats:
            with translated("heartbeat"):
                await self.redis.execute("HSET", wire.HANDLERS_KEY, *beats)

    async def served_elsewhere(self, now: float, max_age_s: float) -> set[str]:
        """Addresses some bridge announced within ``max_age_s``."""
        with translated("reading handlers"):
            beats = _pairs(await self.redis.execute("HGETALL", wire.HANDLERS_KEY))
        return {address for address, when in beats.items() if now - float(when) <= max_age_s}

    async def job_streams(self) -> list[str]:
        """The job stream of every address in the addresses set."""
        with translated("listing job streams"):
            addresses: Any = await self.redis.execute("SMEMBERS", wire.ADDRESSES_KEY)
        return sorted(wire.jobs_stream(address) for address in addresses)

    async def note_existing_streams(self) -> int:
        """Add every job stream in the keyspace to the addresses set (one SCAN, at a bridge's start).

        Streams written by producers that XADD directly, or before the set existed, are found this way.
        """
        found: list[str] = []
        cursor = "0"
        with translated("listing job streams"):
            while True:
                reply: Any = await self.redis.execute(
                    "SCAN", cursor, "MATCH", wire.JOBS_PREFIX + "*", "COUNT", 1000, "TYPE", "STREAM"
                )
                cursor = reply[0]
                found += [wire.address_of(name) for name in reply[1]]
                if cursor == "0":
                    break
            if found:
                await self.redis.execute("SADD", wire.ADDRESSES_KEY, *found)
        return len(found)

    async def forget_if_empty(self, stream: str) -> bool:
        """Drop the stream's address from the set when the stream is gone or empty (atomic with the check)."""
        address = wire.address_of(stream)
        with translated("pruning addresses"):
            return bool(await self.redis.evalsha(self._prune, [stream, wire.ADDRESSES_KEY], [address]))


def _entries(raw: Any) -> list[Entry]:
    """XREAD / XREADGROUP's raw reply (nil, or [stream, [[id, [field, value, ...] or nil] or nil, ...]] per
    stream); an entry deleted since it was delivered has no fields (nil) or is nil itself (XAUTOCLAIM)."""
    found: list[Entry] = []
    for name, entries in raw or ():
        for entry in entries:
            if entry is None:
                continue
            entry_id, flat = entry
            flat = flat or ()
            found.append((name, entry_id, dict(zip(flat[::2], flat[1::2], strict=True))))
    return found


def _pairs(flat: Any) -> dict[str, str]:
    """A raw [key, value, key, value, ...] reply (HGETALL, CONFIG GET) as a dict."""
    flat = flat or ()
    return dict(zip(flat[::2], flat[1::2], strict=True))
