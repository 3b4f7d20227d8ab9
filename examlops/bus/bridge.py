"""The bridge: consumes the model streams of the bus in group ``bridges`` and answers every job exactly once.

Contract:

- One handler per catalog model address, registered at start-up; jobs for an
  address no live bridge serves get a ``model_not_found`` reply.
- At most ``settings.bus.concurrency`` jobs in flight; the bridge reads only as many
  jobs as it has room for, so a job never waits in a bridge while counting as
  idle (it would be reclaimed and served twice).
- Exactly one reply per job id: the reply, the done key, the XACK and the XDEL
  are one Lua script (``scripts.REPLY_SCRIPT``), and the done key is checked
  before serving, so a redelivered or replayed job is acked without asking
  serving again. The check of freshly read jobs is one MGET per read, sent as
  soon as the read returns, so it travels while the jobs are verified instead
  of after. A done key lives to its job's deadline plus ``wire.DONE_MARGIN_S``;
  a copy of a job older than that is acked and dead-lettered without a reply,
  so its job id never gets a second one.
- A bridge that dies holding jobs loses none: every bridge XAUTOCLAIMs jobs
  idle for longer than its connect plus read timeout; a job delivered more
  than ``wire.MAX_DELIVERIES`` times is dead-lettered with an error reply.
- A lost Redis is logged once; the loops back off and carry on, and a reply
  that cannot be written is retried until the job's deadline (then the job
  stays pending and is reclaimed).
- ``on_served.record`` runs once per job that reached its handler and was
  answered for the first time; never for duplicates, refused or expired jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from examlops.adapters.redis import RedisCommands
from examlops.bus import wire
from examlops.bus.hop import ModelHandler, Outcome
from examlops.bus.store import BusStore, Entry
from examlops.core import records
from examlops.core.backoff import Outage
from examlops.core.errors import ConfigError, ModelNotFound, StoreUnavailable
from examlops.core.settings import Settings
from examlops.registry.catalog import Catalog

log = logging.getLogger(__name__)

ORPHAN_SWEEP_EVERY = 5
"""Look for jobs on streams of unknown addresses once per this many sweeps (the addresses set, no SCAN)."""


class Bridge:
    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        redis: RedisCommands,
        http_client: httpx.AsyncClient,
        on_served: records.InferenceRecorder | None = None,
        *,
        serving_url: str | None = None,
        consumer: str | None = None,
        reclaim_idle_s: float | None = None,
        sweep_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        http = settings.http
        self.reclaim_idle_s = reclaim_idle_s or http.connect_timeout_s + http.read_timeout_s + 2.0
        if self.reclaim_idle_s <= http.read_timeout_s:
            raise ConfigError(f"the reclaim idle time must exceed the HTTP read timeout ({http.read_timeout_s} s)")
        self.settings = settings
        self.store = BusStore(redis, reply_ttl_s=settings.bus.reply_ttl_s)
        self.on_served = on_served or records.NoRecorder()
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        # Finish tokens: this instance's own prefix (a consumer name may be given, and reused after a
        # restart) and a counter.
        self._token_prefix = f"{self.consumer}:{secrets.token_hex(4)}:"
        self._finishes = itertools.count()
        self.max_concurrency = settings.bus.concurrency
        self.block_ms = settings.bus.block_ms
        self.sweep_s = sweep_s
        self.clock = clock
        url = serving_url or settings.serving.local_url
        self.handlers = {
            str(spec.seanerbus_uuid): ModelHandler(spec, http_client, url, http, clock) for spec in catalog
        }
        self.streams = [wire.jobs_stream(address) for address in self.handlers]
        self._secret = settings.secret.get_secret_value().encode()
        self._in_flight: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._room: asyncio.Event | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then finish the jobs in flight.

        Raises ``StoreUnavailable`` when Redis cannot be reached at start-up; later outages are waited out.
        """
        try:
            await self._run(stop)
        finally:
            await self.store.aclose()

    async def _run(self, stop: asyncio.Event) -> None:
        await self._warn_without_persistence()
        await self.store.ensure_groups(self.streams)
        await self.store.note_existing_streams()
        await self.store.heartbeat(self.handlers, self.clock())
        self._room = asyncio.Event()
        log.info(
            "bridge %s ready: %d handlers, reclaim after %.1f s idle",
            self.consumer,
            len(self.handlers),
            self.reclaim_idle_s,
        )
        reader = asyncio.create_task(self._read_loop(stop), name="bridge-read")
        sweeper = asyncio.create_task(self._sweep_loop(stop), name="bridge-sweep")
        stopped = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait([stopped, reader, sweeper], return_when=asyncio.FIRST_COMPLETED)
            for task in done - {stopped}:
                task.result()  # a loop that ended before stop was set crashed: raise its error
            # Both loops end by themselves within one BLOCK, so the reader never drops jobs it has just read.
            # They are not cancelled first: a cancelled XREADGROUP BLOCK in redis-py 8.1 was seen to hang.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(asyncio.gather(reader, sweeper)), self.block_ms / 1000 + 5)
        finally:
            for task in (stopped, reader, sweeper):
                task.cancel()
            await asyncio.gather(stopped, reader, sweeper, return_exceptions=True)
            await asyncio.gather(*self._in_flight.values(), return_exceptions=True)
            log.info("bridge %s stopped", self.consumer)

    async def _warn_without_persistence(self) -> None:
        if self.settings.redis_owned:
            return
        appendonly = await self.store.appendonly()
        if appendonly != "yes":
            why = "has appendonly no" if appendonly else "refused CONFIG GET, so its persistence is unknown"
            log.warning(
                "the external Redis %s: jobs accepted before a Redis restart can be lost. Set appendonly yes with "
                "appendfsync everysec on it, or unset EXAMLOPS_REDIS__URL to let examlops own its Redis.",
                why,
            )

    async def _read_loop(self, stop: asyncio.Event) -> None:
        outage = Outage(f"bridge {self.consumer}", log)
        assert self._room is not None
        while not stop.is_set():
            room = self.max_concurrency - len(self._in_flight)
            if room <= 0:
                self._room.clear()
                await _first(self._room.wait(), stop.wait())
                continue
            try:
                entries = await self.store.read(self.consumer, self.streams, room, self.block_ms)
            except StoreUnavailable as exc:
                await _pause(outage.lost(exc), stop)
                continue
            outage.back()
            if entries:
                done = self._check_done(entries)
                for entry in entries:
                    self._spawn(entry, delivered=1, done=done)

    async def _sweep_loop(self, stop: asyncio.Event) -> None:
        outage = Outage(f"bridge {self.consumer} sweeper", log)
        sweeps = 0
        while not stop.is_set():
            try:
                await self.store.heartbeat(self.handlers, self.clock())
                await self._reclaim()
                if sweeps % ORPHAN_SWEEP_EVERY == 0:
                    await self._answer_orphans()
                outage.back()
                sweeps += 1
                await _pause(self.sweep_s, stop)
            except StoreUnavailable as exc:
                await _pause(outage.lost(exc), stop)

    async def _reclaim(self) -> None:
        for stream in self.streams:
            room = max(1, self.max_concurrency - len(self._in_flight))
            for entry in await self.store.autoclaim(stream, self.consumer, int(self.reclaim_idle_s * 1000), room):
                if (entry[0], entry[1]) in self._in_flight:
                    continue
                delivered = await self.store.deliveries(stream, entry[1])
                log.warning("reclaimed job %s on %s (delivery %d)", entry[1], stream, delivered)
                self._spawn(entry, delivered)

    async def _answer_orphans(self) -> None:
        """Jobs on streams of addresses that no live bridge serves get a model_not_found reply, not silence."""
        served = await self.store.served_elsewhere(self.clock(), self.settings.bus.handler_ttl_s) | set(self.handlers)
        orphans = [
            stream
            for stream in await self.store.job_streams()
            if wire.address_of(stream) not in served and not await self.store.forget_if_empty(stream)
        ]
        if orphans:
            await self.store.ensure_groups(orphans)
            for entry in await self.store.read(self.consumer, orphans, 100, None):  # BLOCK 0 would wait forever
                self._spawn(entry, delivered=1)

    def _check_done(self, entries: list[Entry]) -> asyncio.Task[set[str]]:
        """Which of these jobs were answered already, asked at once; the ids are not verified yet: a pre-check.

        Created before the jobs' tasks, so the MGET is on its way while they check signatures.
        """
        ids = [job_id for _s, _e, fields in entries if 0 < len(job_id := fields.get("job_id", "")) <= 128]
        return asyncio.create_task(self._done_among(ids))

    async def _done_among(self, job_ids: list[str]) -> set[str]:
        try:
            return await self.store.done_among(job_ids)
        except StoreUnavailable:
            return set()  # served then; the reply script still writes one reply per job id

    def _spawn(self, entry: Entry, delivered: int, done: asyncio.Task[set[str]] | None = None) -> None:
        key = (entry[0], entry[1])
        if key in self._in_flight:
            return
        task = asyncio.create_task(self._process(*entry, delivered=delivered, done=done))
        self._in_flight[key] = task
        task.add_done_callback(lambda _t: self._done(key))

    def _done(self, key: tuple[str, str]) -> None:
        self._in_flight.pop(key, None)
        if self._room is not None:
            self._room.set()

    async def _process(
        self,
        stream: str,
        entry_id: str,
        fields: Mapping[str, str],
        *,
        delivered: int,
        done: asyncio.Task[set[str]] | None,
    ) -> None:
        try:
            await self._serve(stream, entry_id, fields, delivered, done)
        except Exception:
            # The job stays pending and is reclaimed; a job that keeps failing ends in the dead-letter stream.
            log.exception("job %s on %s failed in the bridge", entry_id, stream)

    async def _serve(
        self,
        stream: str,
        entry_id: str,
        fields: Mapping[str, str],
        delivered: int,
        done: asyncio.Task[set[str]] | None,
    ) -> None:
        address = wire.address_of(stream)
        try:
            job = wire.decode_job(self._secret, address, fields, self.clock())
        except wire.MalformedJob as exc:
            log.warning("refused entry %s on %s: %s", entry_id, stream, exc)
            dead: dict[str, Any] = {
                "stream": stream,
                "reason": exc.code,
                "message": exc.message,
                "fields": dict(fields),
            }
            # Keyed by entry, not by the unverified job id, so a forged job cannot use up a real job's reply.
            body = wire.error_body(exc, job_id=exc.job_id)
            await self._finish(stream, entry_id, f"entry:{stream}:{entry_id}", exc.reply_to, body, dead=dead)
            return
        if self.clock() > job.deadline + wire.DONE_MARGIN_S:
            # Its done key may be gone by now: a copy this old gets no reply, so its job id never gets two.
            log.warning(
                "job %s on %s expired more than %.0f s ago: dead-lettered", job.job_id, stream, wire.DONE_MARGIN_S
            )
            stale = {"stream": stream, "reason": "stale", "fields": dict(fields)}
            await self._finish(stream, entry_id, f"entry:{stream}:{entry_id}", None, {}, dead=stale)
            return
        handler = self.handlers.get(address)
        model = handler.spec.name if handler else None
        if delivered > wire.MAX_DELIVERIES:
            error = wire.Undeliverable(
                f"the job was delivered {delivered} times without an answer; it was dead-lettered"
            )
            dead = {
                "stream": stream,
                "reason": error.code,
                "delivered": delivered,
                "fields": dict(fields),
            }
            await self._finish(
                stream,
                entry_id,
                job.job_id,
                job.reply_to,
                wire.error_body(error, model=model, job_id=job.job_id),
                dead=dead,
                job=job,
            )
            return
        answered = await (done if done is not None else self._done_among([job.job_id]))
        if job.job_id in answered:
            await self._finish(stream, entry_id, job.job_id, job.reply_to, {}, job=job)
            return
        outcome: Outcome
        expired = job.expired(self.clock())
        if handler is None:
            outcome = Outcome(
                wire.error_body(ModelNotFound(f"no model has the bus address {address[:64]}"), job_id=job.job_id),
                0,
                False,
            )
        elif expired is not None:
            outcome = Outcome(wire.error_body(expired, model=model, job_id=job.job_id), 0, False)
        else:
            outcome = await handler.handle(job)
        first = await self._finish(
            stream, entry_id, job.job_id, job.reply_to, outcome.body, status=outcome.status, job=job
        )
        if first and outcome.recorded and handler is not None:
            self._record(job, handler, outcome)

    async def _finish(
        self,
        stream: str,
        entry_id: str,
        done_id: str,
        reply_to: str | None,
        body: Mapping[str, Any],
        *,
        status: int = 0,
        dead: Mapping[str, Any] | None = None,
        job: wire.Job | None = None,
    ) -> bool:
        """Run the reply script, retrying a lost Redis until the job's deadline (at least 30 s)."""
        give_up = max(job.deadline if job else 0.0, self.clock() + 30.0)
        token = f"{self._token_prefix}{next(self._finishes)}"  # this finish's, kept across its retries
        outage: Outage | None = None  # built on the first failure only: this runs once per job
        fields = wire.reply_fields(done_id if job else str(body.get("job_id") or ""), body, status)
        while True:
            try:
                first = await self.store.finish(
                    stream,
                    entry_id,
                    done_id=done_id,
                    reply_to=reply_to,
                    reply=fields,
                    dead=dead,
                    done_ttl_s=wire.done_ttl(job.deadline if job else None, self.clock()),
                    token=token,
                )
                if outage is not None:
                    outage.back()
                return first
            except StoreUnavailable as exc:
                outage = outage or Outage(f"bridge {self.consumer} reply", log)
                if self.clock() >= give_up:
                    log.warning(
                        "gave up replying to %s on %s; it stays pending and will be reclaimed", entry_id, stream
                    )
                    return False
                await asyncio.sleep(outage.lost(exc))

    def _record(self, job: wire.Job, handler: ModelHandler, outcome: Outcome) -> None:
        embedding, nodes = job.payload.get("embedding"), job.payload.get("node_count")
        valid = outcome.body.get("code") != "invalid_input"
        served = records.ServedInference(
            job_id=job.job_id,
            address=job.address,
            model=handler.spec.name,
            caller=job.caller,
            embedding=tuple(embedding) if valid and isinstance(embedding, list) else (),
            node_count=nodes if valid and type(nodes) is int else 0,
            reply=outcome.body,
            status=outcome.status,
            served_at=self.clock(),
        )
        try:
            self.on_served.record([served])
        except Exception:
            log.exception("the inference recorder failed for job %s", job.job_id)


async def _pause(seconds: float, stop: asyncio.Event) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def _first(*waits: Any) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
