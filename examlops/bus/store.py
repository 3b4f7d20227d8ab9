"""The Redis adapter of the bus: every Redis command the client and the bridge send.

redis-py's errors are translated here: an unreachable or restarting Redis is
``StoreUnavailable`` (after connecting was retried with exponential backoff,
a few seconds in all; a command whose connection dropped while it was in
flight is not sent again, as it may have run), so the loops above handle one
error of ours. The scripts are run with EVALSHA and loaded again when a
restarted Redis has forgotten them. The per-job commands and the blocking reads
take the lean path of ``redis_pipe`` (same errors).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from examlops.adapters.redis import translated
from examlops.bus import scripts, wire
from examlops.bus.redis_pipe import PipelinedRedis
from examlops.core.jsoncodec import canonical
from examlops.core.records import RECORDS_DROPPED, RECORDS_STREAM

log = logging.getLogger(__name__)

Entry = tuple[str, str, dict[str, str]]
"""(stream, entry id, fields)."""


class BusStore:
    """The bus's commands. The per-job ones (submit, the done check, the reply) and the reads of jobs and replies
    go through ``PipelinedRedis`` connections to the same server when its URL is plain TCP (see ``redis_pipe``);
    call ``aclose`` to close them."""

    def __init__(self, redis: aioredis.Redis, *, reply_ttl_s: int = wire.REPLY_STREAM_TTL_S) -> None:
        self.redis = redis
        self.reply_ttl_s = reply_ttl_s
        self.pipe = PipelinedRedis.from_client(redis)
        self.waits = PipelinedRedis.from_client(redis)
        """A connection of its own for the blocking reads: a BLOCK holds up every command behind it."""
        self._finish = redis.register_script(scripts.REPLY_SCRIPT)
        self._submit = redis.register_script(scripts.SUBMIT_SCRIPT)
        self._prune = redis.register_script(scripts.PRUNE_SCRIPT)

    async def aclose(self) -> None:
        """Close the pipelined connections (the redis-py client is its owner's to close)."""
        for pipe in (self.pipe, self.waits):
            if pipe is not None:
                await pipe.aclose()

    async def _script(self, script: AsyncScript, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        if self.pipe is None:
            return await script(keys=keys, args=args)
        return await self.pipe.evalsha(str(script.script), script.sha, keys, args)

    # The client's side.

    async def submit(self, address: str, fields: Mapping[str, str]) -> str:
        args: list[str | int] = [address, wire.JOB_STREAM_MAXLEN]
        for name, value in fields.items():
            args += [name, value]
        with translated("submitting a job"):
            entry: Any = await self._script(self._submit, [wire.jobs_stream(address), wire.ADDRESSES_KEY], args)
        return str(entry)

    async def replies(self, stream: str, after: str, block_ms: int) -> list[tuple[str, dict[str, str]]]:
        with translated("reading replies"):
            if self.waits is None:
                found: Any = await self.redis.xread({stream: after}, count=256, block=block_ms)
                return [(entry_id, fields) for _name, entries in found or [] for entry_id, fields in entries]
            raw = await self.waits.execute("XREAD", "COUNT", 256, "BLOCK", block_ms, "STREAMS", stream, after)
        return [(entry_id, fields) for _name, entry_id, fields in _entries(raw)]

    # The bridge's side.

    async def ensure_groups(self, streams: Iterable[str]) -> None:
        """The group reads from the start of each stream: jobs sent before any bridge ran are served too."""
        with translated("creating consumer groups"):
            for stream in streams:
                try:
                    await self.redis.xgroup_create(stream, wire.GROUP, id="0", mkstream=True)
                except ResponseError as exc:
                    if "BUSYGROUP" not in str(exc):
                        raise

    async def read(self, consumer: str, streams: Sequence[str], count: int, block_ms: int | None) -> list[Entry]:
        """New jobs for ``consumer``; waits up to ``block_ms`` for one (None: returns at once)."""
        with translated("reading jobs"):
            pipe = self.pipe if block_ms is None else self.waits
            if pipe is None:
                found: Any = await self.redis.xreadgroup(
                    wire.GROUP, consumer, dict.fromkeys(streams, ">"), count=count, block=block_ms
                )
                return [(name, entry_id, fields) for name, entries in found or [] for entry_id, fields in entries]
            wait: list[str | int] = [] if block_ms is None else ["BLOCK", block_ms]
            raw = await pipe.execute(
                "XREADGROUP", "GROUP", wire.GROUP, consumer, "COUNT", count, *wait, "STREAMS", *streams,
                *[">"] * len(streams),
            )  # fmt: skip
        return _entries(raw)

    async def done_among(self, job_ids: Sequence[str]) -> set[str]:
        """The ids among ``job_ids`` whose reply was already written: one MGET for a whole read, not one per job."""
        if not job_ids:
            return set()
        with translated("checking jobs"):
            keys = [wire.done_key(job_id) for job_id in job_ids]
            found: Any = await (self.redis.mget(keys) if self.pipe is None else self.pipe.execute("MGET", *keys))
        return {job_id for job_id, value in zip(job_ids, found, strict=True) if value is not None}

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
    ) -> bool:
        """Reply (and dead-letter) once per ``done_id``, then XACK and XDEL the entry. True when this was the first.

        ``token`` names this finish (unique, the same on each of its retries): a retry after an answer that was
        lost on the way back (the script ran) is still told True. Without one, every retry is told False.
        ``record`` (``ServedInference.packed``) goes to the records stream with the reply, in the same step,
        unless the stream holds ``records_bound`` entries (then it is counted as dropped).
        """
        token = token or secrets.token_hex(8)
        keys = [stream, wire.done_key(done_id), reply_to or "", wire.DEAD_STREAM]
        keys += [RECORDS_STREAM if record else "", RECORDS_DROPPED]
        args: list[str | int] = [wire.GROUP, entry_id, done_ttl_s, wire.REPLY_STREAM_MAXLEN]
        args += [self.reply_ttl_s, wire.DEAD_STREAM_MAXLEN, "" if dead is None else canonical(dead), token]
        args += [record, records_bound]
        for name, value in reply.items():
            args += [name, value]
        with translated("writing a reply"):
            return bool(await self._script(self._finish, keys, args))

    async def autoclaim(self, stream: str, consumer: str, min_idle_ms: int, count: int) -> list[Entry]:
        """Claim jobs idle for ``min_idle_ms`` (a dead bridge's); each claim counts one more delivery."""
        claimed: list[Entry] = []
        start = "0-0"
        with translated("reclaiming jobs"):
            while len(claimed) < count:
                reply = await self.redis.xautoclaim(stream, wire.GROUP, consumer, min_idle_ms, start, count=count)
                start, entries = reply[0], reply[1]
                claimed += [(stream, entry_id, fields or {}) for entry_id, fields in entries]
                if start == "0-0":
                    break
        return claimed

    async def deliveries(self, stream: str, entry_id: str) -> int:
        with translated("counting deliveries"):
            pending = await self.redis.xpending_range(stream, wire.GROUP, entry_id, entry_id, 1)
        return int(pending[0]["times_delivered"]) if pending else 0

    async def appendonly(self) -> str | None:
        """``CONFIG GET appendonly``: "yes", "no", or None when CONFIG is refused (managed Redis)."""
        with translated("reading the configuration"):
            try:
                config = await self.redis.config_get("appendonly")
            except ResponseError:
                return None
        value = config.get("appendonly")
        return None if value is None else str(value)

    async def heartbeat(self, addresses: Iterable[str], now: float) -> None:
        with translated("heartbeat"):
            await self.redis.hset(wire.HANDLERS_KEY, mapping=dict.fromkeys(addresses, repr(now)))

    async def served_elsewhere(self, now: float, max_age_s: float) -> set[str]:
        """Addresses some bridge announced within ``max_age_s``."""
        with translated("reading handlers"):
            beats: Any = await self.redis.hgetall(wire.HANDLERS_KEY)
        return {address for address, when in beats.items() if now - float(when) <= max_age_s}

    async def job_streams(self) -> list[str]:
        """The job stream of every address in the addresses set."""
        with translated("listing job streams"):
            addresses: Any = await self.redis.smembers(wire.ADDRESSES_KEY)
        return sorted(wire.jobs_stream(address) for address in addresses)

    async def note_existing_streams(self) -> int:
        """Add every job stream in the keyspace to the addresses set (one SCAN, at a bridge's start).

        Streams written by producers that XADD directly, or before the set existed, are found this way.
        """
        with translated("listing job streams"):
            found = [
                wire.address_of(name)
                async for name in self.redis.scan_iter(match=wire.JOBS_PREFIX + "*", count=1000, _type="STREAM")
            ]
            if found:
                await self.redis.sadd(wire.ADDRESSES_KEY, *found)
        return len(found)

    async def forget_if_empty(self, stream: str) -> bool:
        """Drop the stream's address from the set when the stream is gone or empty (atomic with the check)."""
        address = wire.address_of(stream)
        with translated("pruning addresses"):
            return bool(await self._prune(keys=[stream, wire.ADDRESSES_KEY], args=[address]))


def _entries(raw: Any) -> list[Entry]:
    """XREAD / XREADGROUP's raw reply (nil, or [stream, [[id, [field, value, ...] or nil], ...]] per stream)."""
    found: list[Entry] = []
    for name, entries in raw or ():
        for entry_id, flat in entries:
            flat = flat or ()
            found.append((name, entry_id, dict(zip(flat[::2], flat[1::2], strict=True))))
    return found
