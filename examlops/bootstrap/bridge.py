"""The bus: the bridge assembly (its Redis client, the HTTP hop to serving, recording, the ``Bridge``) and clients.

``BridgeProcess(settings, models=..., record=...)`` builds nothing until ``run()``; ``run()`` starts the
recording child (``bootstrap.recording``), serves in the foreground until ``close()`` (from any thread) or
SIGTERM/SIGINT, then finishes the jobs in flight, lets the child drain the records, writes the traces of the
jobs it refused (``bootstrap.tracing``) and closes every client.
With ``record`` off the bridge writes no records and runs no child. It raises ``StoreUnavailable`` when
Redis cannot be reached at start-up; later outages are waited out by the bridge.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from examlops.bootstrap.clients import bus_redis, hop_client
from examlops.bootstrap.identity import platform_token
from examlops.bootstrap.recording import bridge_recording
from examlops.bootstrap.serving import catalog
from examlops.bootstrap.sql import sql_engine
from examlops.bootstrap.tracing import call_tracer
from examlops.core.collector import quiet_collector
from examlops.core.settings import Settings

BRIDGE_YOUNG = 20_000
"""The bridge's youngest-generation threshold after start-up (``core.collector.quiet_collector``)."""

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from examlops.bus.client import BusClient
    from examlops.bus.ports import BusKeys, TaskAddress, TaskAddresses
    from examlops.bus.sync_client import SyncBusClient

log = logging.getLogger(__name__)


class BridgeProcess:
    """One bridge: serves ``models`` (catalog names, any case; None = every catalog model)."""

    def __init__(self, settings: Settings, *, models: Sequence[str] | None = None, record: bool = True) -> None:
        served = catalog(settings)
        self.catalog = served if models is None else served.only(list(models))
        self.settings = settings
        self.record = record
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    def run(self) -> None:
        run_event_loop(self._main())

    def close(self) -> None:
        """Ask a running bridge to stop (thread-safe); ``run()`` returns once it has drained."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def _main(self) -> None:
        from examlops.bus.bridge import Bridge

        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self._stop.set)
        if not self.record:
            log.warning("recording is off: served jobs leave no drift snapshot, no audit event and no failure count")
        redis = bus_redis(self.settings)
        # One consumer name per bridge process: a recording child started again reads what the last one left.
        consumer = f"{socket.gethostname()}-{os.getpid()}"
        recording = bridge_recording(self.settings, consumer) if self.record else contextlib.nullcontext(None)
        engine = sql_engine(self.settings)
        tracer = call_tracer(self.settings, engine)
        tracer.start()
        try:
            with recording:
                async with hop_client(self.settings) as http:
                    keys, tasks = bus_keys(self.settings, engine), task_addresses(self.settings, engine)
                    bridge = Bridge(
                        self.settings, self.catalog, redis, http, keys, tasks=tasks, record=self.record, tracer=tracer
                    )
                    quiet_collector(BRIDGE_YOUNG)  # the collector off the hot path (core.collector)
                    await bridge.run(self._stop)
        finally:
            await redis.aclose()
            await asyncio.to_thread(tracer.close)
            engine.dispose()


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop where it is installed (the bridge's per-job overhead is event-loop work;
    ``bench/bus_vs_http.py``)."""
    try:
        import uvloop
    except ImportError:  # Windows has no uvloop
        asyncio.run(main)
    else:
        uvloop.run(main)


def bus_keys(settings: Settings, engine: Engine | None = None) -> BusKeys:
    """The bridge's key ids to identities (``bus.ports.BusKeys``): the identity store's resolver on
    ``engine`` (the bridge's own, which its owner disposes; None: a new one that is never disposed, for a
    bridge that lives as long as its process); what it says of a key id is cached ``auth.cache_ttl_s``, so
    a revocation stops an identity's jobs within that time. The bus verifies every job whatever
    ``auth.enabled`` says (that switch is HTTP's). ``SchemaNotCurrent`` when the database is behind."""
    from examlops.identity import IdentityResolver
    from examlops.identity.sql import SqlIdentityStore

    return IdentityResolver(SqlIdentityStore(engine or sql_engine(settings)), settings.auth.cache_ttl_s)


def task_addresses(settings: Settings, engine: Engine | None = None) -> TaskAddresses:
    """The task map as a bridge reads it (``bus.ports.TaskAddresses``): SQL on ``engine`` (as ``bus_keys``);
    the bridge keeps its own copy for ``traffic.rules_ttl_s``. ``SchemaNotCurrent`` when the database is not
    at this release's schema."""
    from examlops.tasks.sql import SqlTaskMap

    return SqlTaskMap(engine or sql_engine(settings))


def task_route(settings: Settings, task: str) -> TaskAddress:
    """``task``'s route in the task map (its bus address, model, alias). ``TaskNotFound`` for a task that is
    not mapped, ``InvalidInput`` for a name that cannot be a task; both quote at most a short prefix."""
    from examlops.core.errors import TaskNotFound
    from examlops.tasks.routes import short, task_name
    from examlops.tasks.sql import SqlTaskMap

    engine = sql_engine(settings)
    try:
        route = SqlTaskMap(engine).get(task_name(task))
    finally:
        engine.dispose()
    if route is None:
        raise TaskNotFound(f"task {short(task)!r} is not in the task map (`exa task list` shows it)")
    return route


def bus_client(settings: Settings, *, token: str | None = None, client_id: str | None = None) -> BusClient:
    """A bus client on the settings' Redis (``clients.bus_redis``) that signs with the bus key of ``token``
    (default: ``platform_token``); it owns (and closes) its Redis port. ``Unauthenticated`` without a token
    or with one that is not a token."""
    from examlops.bus.client import BusClient
    from examlops.core.errors import Unauthenticated
    from examlops.identity import bus_key_from_token

    token = token or platform_token(settings)
    if token is None:
        raise Unauthenticated(
            f"no token: set EXAMLOPS_TOKEN, or start the platform (exa up) to create {settings.admin_token_path}"
        )
    key_id, key = bus_key_from_token(token)
    return BusClient(bus_redis(settings), key_id, key, client_id=client_id)


def sync_bus_client(settings: Settings, *, token: str | None = None) -> SyncBusClient:
    """``bus_client`` for sync code (the CLI)."""
    from examlops.bus.sync_client import SyncBusClient

    return SyncBusClient(bus_client(settings, token=token))
