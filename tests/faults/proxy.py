"""``FaultProxy``: a TCP proxy of our own in front of any ``host:port``, with faults switched on and off live.

This machine has no netem and no toxiproxy server, so the fault suite puts this
between a client and Redis, serving or MLflow. It lives in ``tests/faults``
beside its only users: no product code may depend on it, and keeping it out of
``examlops`` keeps it out of the package's import contracts and wheels.

Contract:

- ``FaultProxy(host, port)`` listens on ``127.0.0.1:<free port>`` (``.port``,
  ``.address``) once ``start()`` returns, on an event loop in a daemon thread
  of its own, so sync and async tests drive it alike and a test's blocked loop
  never stalls it. ``stop()`` (or leaving the ``with`` block) closes every
  connection and the listener; idempotent.
- With no fault set it forwards bytes both ways unchanged and in order, and a
  half close (EOF) from either side is passed on.
- The switches are plain attributes, read for each chunk, so a change takes
  effect on live connections at once:

  ========================  ==========================================================================
  ``latency_s``             every chunk, each way, is delivered this much later (order kept; the pipe
                            is not slowed to one chunk per delay)
  ``jitter_s``              plus a uniform random 0..jitter_s (never reordering)
  ``blackhole``             new connections are accepted and held (no upstream connection); chunks on
                            live ones are held; nothing is lost: switching it off delivers what waited
  ``reset_new``             new connections are reset (RST) at once
  ``slow_close_s``          when one side closes, the other side is closed this much later
  ``byte_limit``            each connection is reset once it has carried this many bytes (both ways
                            together); the bytes up to the limit are delivered
  ========================  ==========================================================================

- ``reset_all()`` resets (RST, not FIN) every live connection, both sides.
- ``stats`` counts connections accepted, bytes forwarded and connections reset.

Failure mode: an upstream that refuses is a reset of the client's connection;
errors on one connection never stop the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass
from types import TracebackType

CHUNK = 65536
_HOLD_POLL_S = 0.02


@dataclass
class ProxyStats:
    accepted: int = 0
    forwarded_bytes: int = 0
    resets: int = 0


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.carried = 0
        self.closed = False

    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client, self.upstream) if w is not None]


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset: SO_LINGER on, 0 s, then abort."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int, *, seed: int | None = None) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.latency_s = 0.0
        self.jitter_s = 0.0
        self.blackhole = False
        self.reset_new = False
        self.slow_close_s = 0.0
        self.byte_limit: int | None = None
        self.stats = ProxyStats()
        self.port = 0
        self._random = random.Random(seed)
        self._links: set[_Link] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def clear(self) -> None:
        """Every fault off (live connections carry on)."""
        self.latency_s = self.jitter_s = self.slow_close_s = 0.0
        self.blackhole = self.reset_new = False
        self.byte_limit = None

    def start(self) -> FaultProxy:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name=f"fault-proxy-{self.upstream_port}", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self

    def reset_all(self) -> None:
        """Reset every live connection (both sides) now."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        done = threading.Event()

        def reset() -> None:
            for link in list(self._links):
                self._reset(link)
            done.set()

        loop.call_soon_threadsafe(reset)
        done.wait(5)

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or loop.is_closed():
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for link in list(self._links):
                for writer in link.writers():
                    writer.transport.abort()
            self._links.clear()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # The proxy's own loop.

    def _reset(self, link: _Link) -> None:
        if link.closed:
            return
        link.closed = True
        self.stats.resets += 1
        for writer in link.writers():
            _rst(writer)
        self._links.discard(link)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.accepted += 1
        link = _Link(writer)
        self._links.add(link)
        try:
            if self.reset_new:
                self._reset(link)
                return
            await self._hold(link)
            if link.closed:
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
            except OSError:
                self._reset(link)
                return
            link.upstream = up_writer
            await asyncio.gather(self._pipe(reader, up_writer, link), self._pipe(up_reader, writer, link))
        except Exception:  # one connection's trouble never stops the proxy
            self._reset(link)
        finally:
            self._links.discard(link)
            if not link.closed:
                link.closed = True
                for w in link.writers():
                    w.close()

    async def _hold(self, link: _Link) -> None:
        """Wait while the black hole is on and the link lives."""
        # Polled, not an asyncio.Event: the switch is a plain attribute set from the test's thread, and a reset
        # of the link must end the hold as well.
        while self.blackhole and not link.closed:  # noqa: ASYNC110
            await asyncio.sleep(_HOLD_POLL_S)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, link: _Link) -> None:
        """Read chunks and deliver each when due; EOF is passed on after ``slow_close_s``."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        deliver = asyncio.create_task(self._deliver(queue, sink, link))
        last_due = 0.0
        try:
            while not link.closed:
                try:
                    data = await source.read(CHUNK)
                except (ConnectionError, OSError):
                    self._reset(link)
                    break
                if not data:
                    break
                delay = self.latency_s + (self._random.uniform(0, self.jitter_s) if self.jitter_s > 0 else 0.0)
                last_due = max(last_due, time.monotonic() + delay)
                queue.put_nowait((last_due, data))
            queue.put_nowait((last_due, b""))
            await deliver
        finally:
            deliver.cancel()

    async def _deliver(
        self, queue: asyncio.Queue[tuple[float, bytes]], sink: asyncio.StreamWriter, link: _Link
    ) -> None:
        while True:
            due, data = await queue.get()
            await self._hold(link)
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if link.closed:
                return
            if not data:  # EOF from the other side
                if self.slow_close_s > 0:
                    await asyncio.sleep(self.slow_close_s)
                with contextlib.suppress(OSError, RuntimeError):
                    if sink.can_write_eof():
                        sink.write_eof()
                return
            limit = self.byte_limit
            if limit is not None and link.carried + len(data) >= limit:
                allowed = max(0, limit - link.carried)
                if allowed:
                    sink.write(data[:allowed])
                    with contextlib.suppress(ConnectionError, OSError):
                        await sink.drain()
                link.carried += allowed
                self.stats.forwarded_bytes += allowed
                self._reset(link)
                return
            link.carried += len(data)
            self.stats.forwarded_bytes += len(data)
            sink.write(data)
            try:
                await sink.drain()
            except (ConnectionError, OSError):
                self._reset(link)
                return
