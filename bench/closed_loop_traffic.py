"""Steady traffic to one model's default alias for ``closed_loop.py``: signed bus jobs and direct HTTP calls,
each recorded with when it was sent, when and what came back, and the version that served it.

``Traffic(settings, urls, headers, model, ...)``:

- ``start()`` runs an event loop in a thread of its own that sends ``bus_rate`` jobs a second through the
  bench's own bus client (``bootstrap.bus_client``, signed with the state folder's admin token) and
  ``http_rate`` calls a second to ``POST /v1/models/{model}/predict`` on the serving instances in turn
  (the admin token). The rate is open loop: each request leaves on its own schedule, whatever the
  replies before it are doing, so a stall shows up as late or missing replies and not as fewer requests.
  Inputs are rows of the reference distribution the demo versions were trained on
  (``registry.synthetic.make_dataset``, shift 0), the model's default alias is never named.
- ``stop(grace_s)`` stops sending and waits up to ``grace_s`` for the replies still due (a bus job's own
  timeout is ``timeout_s``); a request still without a reply then is recorded as lost.

Every request ends as one ``Call``: ``answered`` (a prediction), ``failed`` (an error reply, with its code
and, for a model failure, ``inference_failed``), or ``lost`` (no reply within its timeout, a transport or
Redis error: the client never heard back). ``versions_of_traces`` reads which version served a call that
failed from the trace store (an error reply names no version).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import select
from sqlmodel import col

from examlops.bootstrap.bridge import bus_client
from examlops.bootstrap.sql import sql_engine
from examlops.core.errors import DeadlineExceeded, ExamlopsError, Refused, StoreUnavailable
from examlops.core.settings import Settings
from examlops.registry.synthetic import make_dataset
from examlops.tracing import TRACE_HEADER
from examlops.tracing.sql_store import Trace


@dataclass
class Call:
    channel: str
    """``bus`` or ``http``."""
    target: str
    """The serving instance an HTTP call went to; the bus address for a job."""
    sent_at: float
    replied_at: float | None = None
    outcome: str = "pending"
    """``answered``, ``failed``, ``lost`` (``pending`` while in flight)."""
    version: str | None = None
    code: str | None = None
    inference_failed: bool = False
    status: int | None = None
    trace: str | None = None
    detail: str = ""


class Traffic:
    def __init__(
        self, settings: Settings, urls: list[str], headers: dict[str, str], model: str, *,
        bus_rate: float, http_rate: float, dim: int, timeout_s: float = 30.0, rows: int = 1024, seed: int = 5,
    ) -> None:  # fmt: skip
        self.settings, self.urls, self.headers, self.model = settings, urls, headers, model
        self.bus_rate, self.http_rate, self.timeout_s = bus_rate, http_rate, timeout_s
        x, nodes, _ = make_dataset(rows, dim=dim, seed=seed)
        self.bodies = [{"embedding": [float(v) for v in x[i]], "node_count": int(nodes[i])} for i in range(rows)]
        self.calls: list[Call] = []
        self.started_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None
        self._grace_s = 0.0

    def start(self, address: str) -> None:
        self.started_at = time.time()
        self._thread = threading.Thread(target=self._run, args=(address,), name="bench-traffic", daemon=True)
        self._thread.start()

    def stop(self, grace_s: float) -> None:
        self._grace_s = grace_s
        self._stop.set()
        if self._thread is not None:
            self._thread.join(grace_s + 15)

    def _run(self, address: str) -> None:
        try:
            asyncio.run(self._main(address))
        except BaseException as exc:  # the report says the load broke; the bench stops the platform
            self.error = exc

    async def _main(self, address: str) -> None:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with (
            bus_client(self.settings) as bus,
            httpx.AsyncClient(headers=self.headers, timeout=self.timeout_s, limits=limits) as http,
        ):
            pending: set[asyncio.Task[None]] = set()
            bodies = itertools.cycle(self.bodies)
            urls = itertools.cycle(self.urls)

            async def bus_call(body: dict[str, Any]) -> None:
                await self._bus(bus, address, body)

            async def http_call(body: dict[str, Any]) -> None:
                await self._http(http, next(urls), body)

            senders = [
                asyncio.create_task(self._pace(self.bus_rate, bus_call, bodies, pending)),
                asyncio.create_task(self._pace(self.http_rate, http_call, bodies, pending)),
            ]
            await asyncio.to_thread(self._stop.wait)
            for sender in senders:
                sender.cancel()
            await asyncio.gather(*senders, return_exceptions=True)
            if pending:
                await asyncio.wait(pending, timeout=self._grace_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for call in self.calls:
            if call.outcome == "pending":
                call.outcome, call.detail = "lost", "no reply before the bench stopped waiting"

    async def _pace(self, rate: float, send: Any, bodies: Iterable[dict[str, Any]], pending: set[Any]) -> None:
        if rate <= 0:
            return
        interval, next_at = 1.0 / rate, time.monotonic()
        for body in bodies:
            next_at += interval
            task = asyncio.create_task(send(body))
            pending.add(task)
            task.add_done_callback(pending.discard)
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def _bus(self, bus: Any, address: str, body: dict[str, Any]) -> None:
        call = Call("bus", address, time.time())
        self.calls.append(call)
        try:
            reply = await bus.request(address, body, self.timeout_s)
        except asyncio.CancelledError:
            call.outcome, call.detail = "lost", "no reply before the bench stopped waiting"
            raise
        except Refused as exc:
            reply = getattr(exc, "reply", {"code": exc.code, "error": str(exc)})
        except (DeadlineExceeded, StoreUnavailable) as exc:
            call.outcome, call.detail, call.replied_at = "lost", f"{exc.code}: {exc}"[:200], time.time()
            return
        except ExamlopsError as exc:
            call.outcome, call.detail, call.replied_at = "lost", f"{exc.code}: {exc}"[:200], time.time()
            return
        call.replied_at, call.trace = time.time(), reply.get("trace")
        _settle(call, reply)

    async def _http(self, http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> None:
        call = Call("http", url, time.time())
        self.calls.append(call)
        try:
            response = await http.post(f"{url}/v1/models/{self.model}/predict", json=body)
            reply = response.json()
        except asyncio.CancelledError:
            call.outcome, call.detail = "lost", "no reply before the bench stopped waiting"
            raise
        except (httpx.HTTPError, ValueError) as exc:
            call.outcome, call.detail, call.replied_at = "lost", f"{type(exc).__name__}: {exc}"[:200], time.time()
            return
        call.replied_at, call.status = time.time(), response.status_code
        call.trace = response.headers.get(TRACE_HEADER)
        _settle(call, reply)


def _settle(call: Call, reply: dict[str, Any]) -> None:
    if reply.get("error") is None:
        call.outcome, call.version = "answered", str(reply.get("version"))
        return
    call.outcome, call.code = "failed", str(reply.get("code"))
    call.inference_failed = reply.get("inference_failed") is True
    call.detail = str(reply.get("error"))[:200]


def versions_of_traces(settings: Settings, traces: list[str]) -> dict[str, str | None]:
    """trace id -> the version its trace row names (None: the row has none); ids without a row are left out."""
    engine = sql_engine(settings)
    found: dict[str, str | None] = {}
    try:
        with engine.connect() as connection:
            for i in range(0, len(traces), 500):
                chunk = traces[i : i + 500]
                query = select(col(Trace.trace_id), col(Trace.version)).where(col(Trace.trace_id).in_(chunk))
                rows = connection.execute(query)
                found.update({trace_id: version for trace_id, version in rows})
    finally:
        engine.dispose()
    return found
