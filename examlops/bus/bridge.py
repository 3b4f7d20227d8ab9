"""The bridge: consumes the model streams of the bus in group ``bridges`` and answers every job exactly once.

Contract:

- One handler per catalog model address, registered at start-up, and one per
  task address whose model is in the catalog, from the task map read again
  every ``settings.traffic.rules_ttl_s`` (``addresses.Addresses``); jobs for an
  address no live bridge serves get a ``model_not_found`` reply.
- Every job is verified with the bus key of the identity it names
  (``ports.BusKeys``) and checked against that identity's permissions before
  it is served (``jobs.JobRunner``).
- At most ``settings.bus.concurrency`` jobs in flight; the bridge reads only as many
  jobs as it has room for, so a job never waits in a bridge while counting as
  idle (it would be reclaimed and served twice).
- Each job goes to ``jobs.JobRunner`` (verify, serve, one reply script that also
  writes the job's record). The check of freshly read jobs' done keys is one
  MGET per read, sent as soon as the read returns, so it travels while the
  jobs are verified instead of after.
- A bridge that dies holding jobs loses none: every bridge's sweep XAUTOCLAIMs
  jobs idle for longer than its connect plus read timeout; a job delivered more
  than ``wire.MAX_DELIVERIES`` times is dead-lettered with an error reply.
- Every job carries a trace id (derived from its job id once verified) to serving and in its reply's
  ``trace`` field; serving traces the calls it answers, the ``tracer`` the jobs it never saw.
- Every deadline, heartbeat and record time is on the bus's clock (``clock.RedisClock``: Redis's TIME, sampled
  at start, on each sweep once a minute, and again after an outage), never this machine's wall clock.
- A lost Redis is logged once; the loops back off and carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Callable
from typing import Any

import httpx

from examlops.adapters.redis import RedisCommands
from examlops.bus import wire
from examlops.bus.addresses import Addresses
from examlops.bus.clock import RedisClock, refresh, resync
from examlops.bus.hop import ModelHandler
from examlops.bus.jobs import DoneCheck, JobRunner
from examlops.bus.ports import BusKeys, TaskAddresses
from examlops.bus.store import BusStore, Entry
from examlops.core.backoff import Outage
from examlops.core.errors import ConfigError, StoreUnavailable
from examlops.core.settings import Settings
from examlops.registry.catalog import Catalog, ModelSpec
from examlops.tracing import Tracer

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
        keys: BusKeys,
        *,
        tasks: TaskAddresses | None = None,
        record: bool = True,
        serving_url: str | None = None,
        consumer: str | None = None,
        reclaim_idle_s: float | None = None,
        sweep_s: float = 1.0,
        clock: Callable[[], float] | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        http = settings.http
        self.reclaim_idle_s = reclaim_idle_s or http.connect_timeout_s + http.read_timeout_s + 2.0
        if self.reclaim_idle_s <= http.read_timeout_s:
            raise ConfigError(f"the reclaim idle time must exceed the HTTP read timeout ({http.read_timeout_s} s)")
        self.settings = settings
        self.store = BusStore(redis, reply_ttl_s=settings.bus.reply_ttl_s)
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.max_concurrency = settings.bus.concurrency
        self.block_ms = settings.bus.block_ms
        self.sweep_s = sweep_s
        self.clock = clock = clock or RedisClock(redis, errs="ahead")  # never more time left than there is
        """The bus's clock (Redis's TIME, see ``clock``); injected in tests."""
        url = serving_url or settings.serving.local_url

        def handler(spec: ModelSpec, task: str | None, budget_ms: float | None) -> ModelHandler:
            return ModelHandler(spec, http_client, url, http, clock, task=task, budget_ms=budget_ms)

        self.addresses = Addresses(catalog, handler, tasks, ttl_s=settings.traffic.rules_ttl_s, clock=clock)
        self.jobs = JobRunner(
            self.store,
            self.addresses.handler_of,
            keys,
            self.consumer,
            record=record,
            records_bound=settings.recording.bound,
            clock=clock,
            tracer=tracer,
        )
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
        await refresh(self.clock)
        await self._warn_without_persistence()
        await self.addresses.refresh()
        await self.store.ensure_groups(self.addresses.streams)
        await self.store.note_existing_streams()
        await self.store.heartbeat(self.addresses.addresses, self.clock())
        self._room = asyncio.Event()
        log.info(
            "bridge %s ready: %d models, %d tasks, reclaim after %.1f s idle",
            self.consumer,
            len(self.addresses.models),
            len(self.addresses.tasks),
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
                entries = await self.store.read(self.consumer, self.addresses.streams, room, self.block_ms)
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
                await refresh(self.clock)
                if self.addresses.due():
                    await self.store.ensure_groups(await self.addresses.refresh())
                await self.store.heartbeat(self.addresses.addresses, self.clock())
                await self._reclaim()
                if sweeps % ORPHAN_SWEEP_EVERY == 0:
                    await self._answer_orphans()
                outage.back()
                sweeps += 1
                await _pause(self.sweep_s, stop)
            except StoreUnavailable as exc:
                resync(self.clock)  # Redis may come back elsewhere, on another clock
                await _pause(outage.lost(exc), stop)

    async def _reclaim(self) -> None:
        for stream in self.addresses.streams:
            room = max(1, self.max_concurrency - len(self._in_flight))
            for entry in await self.store.autoclaim(stream, self.consumer, int(self.reclaim_idle_s * 1000), room):
                if (entry[0], entry[1]) in self._in_flight:
                    continue
                delivered = await self.store.deliveries(stream, entry[1])
                log.warning("reclaimed job %s on %s (delivery %d)", entry[1], stream, delivered)
                self._spawn(entry, delivered)

    async def _answer_orphans(self) -> None:
        """Jobs on streams of addresses that no live bridge serves get a model_not_found reply, not silence."""
        served = await self.store.served_elsewhere(self.clock(), self.settings.bus.handler_ttl_s)
        served |= set(self.addresses.addresses)
        orphans = [
            stream
            for stream in await self.store.job_streams()
            if wire.address_of(stream) not in served and not await self.store.forget_if_empty(stream)
        ]
        if orphans:
            await self.store.ensure_groups(orphans)
            for entry in await self.store.read(self.consumer, orphans, 100, None):  # BLOCK 0 would wait forever
                self._spawn(entry, delivered=1)

    def _check_done(self, entries: list[Entry]) -> DoneCheck:
        """Which of these jobs were answered already, asked at once; the ids are not verified yet: a pre-check.

        Created before the jobs' tasks, so the MGET is on its way while they check signatures.
        """
        ids = [job_id for _s, _e, fields in entries if 0 < len(job_id := fields.get("job_id", "")) <= 128]
        return asyncio.create_task(self.jobs.done_among(ids))

    def _spawn(self, entry: Entry, delivered: int, done: DoneCheck | None = None) -> None:
        key = (entry[0], entry[1])
        if key in self._in_flight:
            return
        task = asyncio.create_task(self.jobs.process(*entry, delivered, done))
        self._in_flight[key] = task
        task.add_done_callback(lambda _t: self._done(key))

    def _done(self, key: tuple[str, str]) -> None:
        self._in_flight.pop(key, None)
        if self._room is not None:
            self._room.set()


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
