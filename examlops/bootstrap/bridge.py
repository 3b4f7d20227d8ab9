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
import gc
import logging
import os
import signal
import socket
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from examlops.bootstrap.clients import bus_redis, hop_client
from examlops.bootstrap.recording import bridge_recording
from examlops.bootstrap.serving import catalog
from examlops.bootstrap.sql import sql_engine
from examlops.bootstrap.tracing import call_tracer
from examlops.core.settings import Settings

if TYPE_CHECKING:
    from examlops.bus.client import BusClient, SyncBusClient

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
                    bridge = Bridge(self.settings, self.catalog, redis, http, record=self.record, tracer=tracer)
                    tune_garbage_collection()
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


def tune_garbage_collection() -> None:
    """Keep the garbage collector off a bridge's hot path: freeze what start-up built, collect young objects rarely.

    Start-up objects (the imports) are skipped by every collection once frozen, and the youngest generation is
    collected every 20,000 net allocations instead of 700; reference cycles are still collected, only later.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 10, 10)


def bus_client(settings: Settings, *, caller: str, client_id: str | None = None) -> BusClient:
    """A bus client on the settings' Redis (``clients.bus_redis``), signing with the settings' secret; it owns
    (and closes) its Redis port."""
    from examlops.bus.client import BusClient

    secret = settings.secret.get_secret_value().encode()
    return BusClient(bus_redis(settings), secret, caller=caller, client_id=client_id)


def sync_bus_client(settings: Settings, *, caller: str) -> SyncBusClient:
    """``bus_client`` for sync code (the CLI)."""
    from examlops.bus.client import SyncBusClient

    return SyncBusClient(bus_client(settings, caller=caller))
