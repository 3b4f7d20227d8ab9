"""``KeepAliveTransport``: the lean transport under the bridge's httpx client, asyncio protocols and httptools.

httpx keeps its interface, its timeouts and its errors; this replaces only
what it calls to move bytes, for the hop's one small JSON POST per bus job
(why, and the CPU per request measured against httpx's own transport:
``bench/RESULTS.md``). The switch between the two is
``EXAMLOPS_BUS__HTTP_CLIENT``, compared by ``bench/bus_vs_http.py --clients``.

What it does, and no more:

- HTTP/1.1 only, over TCP (TLS when the URL is https), one pool of keep-alive
  connections per origin: at most ``max_connections`` in use (the pool
  timeout bounds the wait for one), idle ones dropped after
  ``keepalive_expiry`` seconds and whenever the server closed them.
- The response is read whole (``Content-Length``, chunked, or until a clean
  close) by httptools, the C parser uvicorn uses, with the headers capped at
  ``max_header_bytes``; bodies are small JSON here. Interim 1xx replies are
  skipped; bytes after a whole reply make its connection unusable (closed,
  the reply kept). The read timeout bounds the whole reply, not each read.
  The client's ``verify``/``cert`` do not reach this transport: give it an
  ``ssl_context``.
- Every failure is httpx's exception, chained to its cause: ``ConnectError``,
  ``ConnectTimeout`` (with a ``TimeoutError`` cause), ``WriteError``,
  ``ReadTimeout`` (with a ``TimeoutError`` cause), ``RemoteProtocolError`` for
  a reply that is not HTTP or a connection closed before a whole reply,
  ``PoolTimeout``. No request is retried, and a connection that failed or was
  cancelled mid-request is closed, never reused.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from typing import Any, cast

import httptools
import httpx

Origin = tuple[bytes, str, int]


class _Connection(asyncio.Protocol):
    """One TCP connection and the reply being read on it."""

    def __init__(self, max_header_bytes: int) -> None:
        self.max_header_bytes = max_header_bytes
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._header_bytes = 0
        self._headers_done = False
        self._delimited = False
        self._complete = False
        self._body: list[bytes] = []
        self._keep_alive = True

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not its subclasses

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():  # bytes nobody asked for: the connection is unusable
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(httpx.RemoteProtocolError("serving asked to switch protocols"))
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _BytesAfterReply):  # the reply was whole; the connection is not
                self.close()
                return
            cause = exc.__context__ if isinstance(exc.__context__, _HeadersTooLarge) else exc
            self._fail(httpx.RemoteProtocolError(f"serving's reply is not readable HTTP/1.1: {cause}"), cause)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is None or self._waiter.done():
            return
        if exc is None and self._headers_done and not self._delimited:  # a body ending with the connection
            self._keep_alive = False
            self._waiter.set_result(None)
            return
        cause = exc or ConnectionResetError("the connection was closed")
        self._fail(httpx.RemoteProtocolError("serving closed the connection before a whole reply"), cause)

    # httptools callbacks

    def on_message_begin(self) -> None:
        if self._complete:  # more after the whole reply: it cannot be the next request's
            raise _BytesAfterReply()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > self.max_header_bytes:
            raise _HeadersTooLarge(f"its headers exceed {self.max_header_bytes} bytes")
        self._headers.append((name, value))
        lowered = name.lower()
        if lowered == b"content-length" or (lowered == b"transfer-encoding" and b"chunked" in value.lower()):
            self._delimited = True

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self._keep_alive = self._parser.should_keep_alive()
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        if 100 <= self._status < 200:  # an interim reply (100 Continue, 103 Early Hints): the real one follows
            self._status, self._headers, self._header_bytes, self._body = 0, [], 0, []
            self._headers_done = self._delimited = False
            return
        self._complete = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # the transport's side

    def _fail(self, error: Exception, cause: BaseException | None = None) -> None:
        error.__cause__ = cause
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(error)
        self.close()

    def _time_out(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(TimeoutError())

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    @property
    def usable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    async def exchange(self, head: bytes, body: bytes, read_timeout: float | None) -> tuple[int, list[Any], bytes]:
        """Send one request and read its whole reply; on any failure (or cancellation) the connection is closed."""
        if not self.usable:  # closed by the server between connecting and now
            self.close()
            raise httpx.RemoteProtocolError("serving closed the connection before the request was sent")
        assert self.transport is not None
        self._status, self._headers, self._header_bytes, self._body = 0, [], 0, []
        self._headers_done, self._delimited, self._complete, self._keep_alive = False, False, False, True
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timer = None if read_timeout is None else loop.call_later(read_timeout, self._time_out)
        try:
            try:
                self.transport.write(head + body)
            except (OSError, RuntimeError) as exc:
                raise httpx.WriteError(f"cannot send the request to serving: {exc}") from exc
            try:
                await waiter
            except TimeoutError as exc:
                raise httpx.ReadTimeout("serving did not answer within the read timeout") from exc
        except BaseException:
            self.close()
            raise
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        if not self._keep_alive:
            self.close()
        return self._status, self._headers, b"".join(self._body)


class _HeadersTooLarge(Exception):
    pass


class _BytesAfterReply(Exception):
    pass


class KeepAliveTransport(httpx.AsyncBaseTransport):
    """httpx's transport interface over pooled keep-alive HTTP/1.1 connections (see the module docstring)."""

    def __init__(
        self,
        *,
        max_connections: int = 64,
        keepalive_expiry: float = 4.0,
        max_header_bytes: int = 65536,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.max_connections = max_connections
        self.keepalive_expiry = keepalive_expiry
        self.max_header_bytes = max_header_bytes
        self._ssl_context = ssl_context
        self._idle: dict[Origin, collections.deque[_Connection]] = {}
        self._slots: asyncio.Semaphore | None = None
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise RuntimeError("the transport is closed")
        url = request.url
        scheme = url.raw_scheme
        if scheme not in (b"http", b"https"):
            raise httpx.UnsupportedProtocol(f"the bridge's transport speaks http and https, not {url.scheme!r}")
        if request.method == "HEAD":  # a reply to HEAD has no body whatever its headers say: not handled here
            raise httpx.LocalProtocolError("the bridge's transport does not send HEAD requests")
        timeouts = request.extensions.get("timeout", {})
        origin: Origin = (scheme, url.host, url.port or (443 if scheme == b"https" else 80))
        body = await request.aread()
        head = _head(request, len(body))
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_connections)
        slots = self._slots
        if slots.locked():
            try:
                async with asyncio.timeout(timeouts.get("pool")):
                    await slots.acquire()
            except TimeoutError as exc:
                raise httpx.PoolTimeout(f"no connection free among {self.max_connections}") from exc
        else:
            await slots.acquire()
        try:
            connection = self._idle_connection(origin) or await self._connect(origin, timeouts.get("connect"))
            status, headers, content = await connection.exchange(head, body, timeouts.get("read"))
            if connection.usable and not self._closed:
                connection.idle_since = time.monotonic()
                self._idle.setdefault(origin, collections.deque()).append(connection)
        finally:
            slots.release()
        return httpx.Response(status, headers=headers, content=content, extensions={"http_version": b"HTTP/1.1"})

    def _idle_connection(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        if not idle:
            return None
        expired = time.monotonic() - self.keepalive_expiry
        while idle:
            connection = idle.pop()  # the most recently used: the least likely to have been closed meanwhile
            if connection.usable and connection.idle_since >= expired:
                return connection
            connection.close()
        return None

    async def _connect(self, origin: Origin, connect_timeout: float | None) -> _Connection:
        scheme, host, port = origin
        context = None
        if scheme == b"https":
            if self._ssl_context is None:  # loading the CA store is slow: once per transport
                self._ssl_context = ssl.create_default_context()
            context = self._ssl_context
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(self.max_header_bytes), host, port, ssl=context),
                connect_timeout,
            )
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"no connection to {host}:{port} within {connect_timeout} s") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        return connection

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


_FORBIDDEN = (b"\r", b"\n", b"\0")


def _head(request: httpx.Request, length: int) -> bytes:
    """The request line and headers; the body's length is set here, whatever the request said.

    ``LocalProtocolError`` for a header that would split the request (CR, LF or NUL; a colon in a name).
    """
    lines = [b"%s %s HTTP/1.1" % (request.method.encode("ascii"), request.url.raw_path)]
    for name, value in request.headers.raw:
        if b":" in name or any(c in name or c in value for c in _FORBIDDEN):
            raise httpx.LocalProtocolError(f"header {name!r} is not a valid HTTP/1.1 header")
        if name.lower() not in (b"content-length", b"transfer-encoding"):
            lines.append(name + b": " + value)
    if length or request.method != "GET":
        lines.append(b"content-length: %d" % length)
    lines.append(b"\r\n")
    return b"\r\n".join(lines)
