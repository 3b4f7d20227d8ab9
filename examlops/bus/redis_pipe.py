"""``PipelinedRedis``: the bus's lean ``RedisCommands`` adapter, one pipelined connection written and parsed
by hiredis. Why it exists (redis-py's per-command CPU) and what it measured: ``bench/RESULTS.md``; the switch
between it and redis-py is ``EXAMLOPS_BUS__REDIS_CLIENT``, compared by ``bench/bus_vs_http.py --clients``.

Contract:

- One TCP connection for the commands, shared by every task of one event
  loop: each command is written at once (pipelined) and the replies resolve
  the callers in order; ``wait`` (blocking reads) has a second connection of
  its own, so a BLOCK holds up no other command.
- Replies are raw RESP2, strings decoded as UTF-8 (a reply that is not UTF-8
  fails its own caller with ``ResponseError``).
- Errors are redis-py's classes: a lost connection fails every command in
  flight with ``ConnectionError``; a reply slower than ``timeout_s`` closes the
  connection and raises ``TimeoutError`` (the command may have run); an error
  reply raises ``ResponseError`` (``NoScriptError``, ``BusyLoadingError``...).
- Connecting is retried with backoff (0.05 s doubling to 1 s, ``retries``
  times), and so is a command that a Redis still loading its data refused:
  neither had run. Callers that arrive while a connection is being opened
  share that attempt. A connection idle for ``idle_check_s`` (30 s) must
  answer a PING before a command goes on it, as redis-py's health check does.
  A command in flight when the connection drops is not sent again (it may
  have run); the bus's own loops decide what to do. A refused AUTH or SELECT
  is ``AuthenticationError``; after ``aclose`` every command is refused.
- ``evalsha`` loads a script the server does not know (NOSCRIPT, after a
  restart) and runs it again.
- ``from_url`` serves plain TCP (``redis://``) with a password or none, and
  refuses a TLS or Unix-socket URL with ``ValueError`` (``speaks(url)`` says
  which).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from typing import Any, cast

import hiredis
from redis.asyncio.connection import parse_url
from redis.exceptions import AuthenticationError, BusyLoadingError, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from examlops.adapters.redis import Arg, LuaScript, evalsha_loading
from examlops.core.backoff import Backoff

RETRY = Backoff(0.05, 1.0)
"""Connecting, and a command a Redis still loading its data refused: 0.05 s doubling to 1 s."""


def _error(reply: ResponseError) -> Exception:
    message = str(reply)
    if message.startswith("NOSCRIPT"):
        return NoScriptError(message)
    if message.startswith("LOADING"):
        return BusyLoadingError(message)
    return reply


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.reader = hiredis.Reader(encoding="utf-8", replyError=ResponseError)
        self.waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.loop = asyncio.get_running_loop()
        self.last_reply = self.loop.time()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        self.last_reply = self.loop.time()
        self.reader.feed(data)
        while True:
            try:
                reply = self.reader.gets()
            except hiredis.ProtocolError as exc:
                self.abort(RedisConnectionError(f"Redis sent something that is not RESP: {exc}"))
                return
            except UnicodeDecodeError as exc:  # one reply that is not UTF-8: its caller's error, as in redis-py
                reply = ResponseError(f"a reply that is not UTF-8 text: {exc}")
            if reply is False:
                return
            if not self.waiting:
                self.abort(RedisConnectionError("Redis sent a reply nobody asked for"))
                return
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(RedisConnectionError(f"the connection to Redis was lost ({exc or 'closed by the server'})"))

    def abort(self, error: Exception) -> None:
        self.closed = True
        self._fail(error)
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, error: Exception) -> None:
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_exception(error)


class PipelinedRedis:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        connect_timeout_s: float = 2.0,
        timeout_s: float = 10.0,
        retries: int = 5,
    ) -> None:
        self.host, self.port, self.db = host, port, db
        self.username, self.password = username, password
        self.connect_timeout_s = connect_timeout_s
        self.timeout_s = timeout_s
        self.retries = retries
        self.idle_check_s = 30.0
        """A connection idle for longer is PINGed before a command is sent on it (redis-py's health check)."""
        self._protocol: _Protocol | None = None
        self._opening: asyncio.Future[_Protocol] | None = None
        self._closed = False
        self._waits: PipelinedRedis | None = None

    @classmethod
    def from_url(cls, url: str, *, connect_timeout_s: float = 2.0, timeout_s: float = 10.0) -> PipelinedRedis:
        """The server, database and credentials of a ``redis://`` URL; ``ValueError`` for any other URL."""
        if not speaks(url):
            raise ValueError("the lean Redis client speaks plain TCP (redis://) only, not TLS or Unix sockets")
        kwargs = parse_url(url)
        return cls(
            str(kwargs.get("host", "localhost")),
            int(kwargs.get("port", 6379)),
            db=int(kwargs.get("db") or 0),
            username=kwargs.get("username"),
            password=kwargs.get("password"),
            connect_timeout_s=connect_timeout_s,
            timeout_s=timeout_s,
        )

    async def execute(self, *args: Arg) -> Any:
        """One command's reply; see the module's contract for the errors."""
        command = hiredis.pack_command(args)  # type: ignore[arg-type]  # the stub types it as a 1-tuple
        attempt = 0
        while True:
            try:
                protocol = await self._ready()
                reply = await self._send(protocol, command)
                if isinstance(reply, ResponseError):
                    raise _error(reply)
                return reply
            except (BusyLoadingError, _NotConnected) as exc:
                if attempt >= self.retries or self._closed:
                    cause = exc.__cause__ if isinstance(exc, _NotConnected) else exc
                    raise RedisConnectionError(f"Redis at {self.host}:{self.port}: {cause}") from cause
                attempt += 1
                await asyncio.sleep(RETRY.delay(attempt))

    async def _ready(self) -> _Protocol:
        """An open connection; one that went quiet for ``idle_check_s`` must answer a PING first."""
        if self._closed:
            raise RedisConnectionError("this connection to Redis was closed")
        protocol = self._protocol
        if protocol is None or protocol.closed or protocol.transport is None or protocol.transport.is_closing():
            return await self._connect()
        if asyncio.get_running_loop().time() - protocol.last_reply > self.idle_check_s:
            try:
                await self._send(protocol, _PING)
            except (RedisConnectionError, RedisTimeoutError):
                return await self._connect()  # nothing of the caller's was sent on it
        return protocol

    async def evalsha(self, script: LuaScript, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        return await evalsha_loading(self.execute, script, keys, args)

    async def wait(self, *args: Arg) -> Any:
        """A blocking command, on a second connection of the same settings (opened on first use)."""
        if self._waits is None:
            self._waits = PipelinedRedis(
                self.host, self.port, db=self.db, username=self.username, password=self.password,
                connect_timeout_s=self.connect_timeout_s, timeout_s=self.timeout_s, retries=self.retries,
            )  # fmt: skip
            self._waits._closed = self._closed
        return await self._waits.execute(*args)

    async def aclose(self) -> None:
        """Close the connections (commands in flight fail) and refuse new commands."""
        self._closed = True
        if self._waits is not None:
            await self._waits.aclose()
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
        protocol, self._protocol = self._protocol, None
        if protocol is not None and not protocol.closed:
            protocol.abort(RedisConnectionError("the connection was closed"))

    async def _send(self, protocol: _Protocol, command: bytes) -> Any:
        if protocol.closed or protocol.transport is None or protocol.transport.is_closing():
            raise _NotConnected() from RedisConnectionError("the connection closed before the command was sent")
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Any] = loop.create_future()
        protocol.waiting.append(waiter)
        protocol.transport.write(command)
        expiry = loop.call_later(self.timeout_s, _expire, protocol, waiter, self.timeout_s)
        try:
            return await waiter
        finally:
            expiry.cancel()

    async def _connect(self) -> _Protocol:
        """A fresh connection; ``_NotConnected`` when that failed. Callers that arrive while one is being opened
        share that attempt (and its failure), so N callers against a dead server wait one timeout, not N."""
        current = self._protocol
        if current is not None and not current.closed and current.transport and not current.transport.is_closing():
            return current  # another caller's attempt opened one meanwhile
        opening = self._opening
        if opening is None or opening.done():
            opening = self._opening = asyncio.ensure_future(self._open())
            opening.add_done_callback(_retrieved)
        return await asyncio.shield(opening)  # a caller's cancellation does not abandon a half-open connection

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await asyncio.wait_for(
                loop.create_connection(_Protocol, self.host, self.port), self.connect_timeout_s
            )
        except (OSError, TimeoutError) as exc:
            raise _NotConnected() from RedisConnectionError(f"cannot connect ({exc or type(exc).__name__})")
        try:
            if self.password:
                auth = (self.username, self.password) if self.username else (self.password,)
                await self._checked(protocol, "AUTH", *auth)
            if self.db:
                await self._checked(protocol, "SELECT", self.db)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            protocol.abort(exc)
            raise _NotConnected() from exc
        except ResponseError as exc:  # a refused password, or no such database: redis-py's class for it
            protocol.abort(RedisConnectionError("closed after a refused AUTH or SELECT"))
            raise AuthenticationError(str(exc)) from exc
        except BaseException:
            transport.abort()
            raise
        if self._closed:
            protocol.abort(RedisConnectionError("the connection was closed"))
            raise RedisConnectionError("this connection to Redis was closed")
        self._protocol = protocol
        return protocol

    async def _checked(self, protocol: _Protocol, *args: Arg) -> Any:
        reply = await self._send(protocol, hiredis.pack_command(args))  # type: ignore[arg-type]
        if isinstance(reply, ResponseError):
            raise _error(reply)
        return reply


def speaks(url: str) -> bool:
    """Whether ``PipelinedRedis`` serves this URL: plain TCP, ``redis://``."""
    return url.startswith("redis://")


class _NotConnected(Exception):
    """Connecting failed (nothing was sent): ``execute`` retries it."""


_PING = hiredis.pack_command(("PING",))


def _retrieved(opening: asyncio.Future[_Protocol]) -> None:
    """Mark a connect attempt's failure as seen even when every caller that waited for it was cancelled."""
    if not opening.cancelled():
        opening.exception()


def _expire(protocol: _Protocol, waiter: asyncio.Future[Any], timeout_s: float) -> None:
    """A reply that did not come in time: the connection's later replies can't be trusted, so it is closed."""
    if not waiter.done():
        waiter.set_exception(RedisTimeoutError(f"no reply from Redis within {timeout_s:g} s"))
        protocol.abort(RedisConnectionError(f"closed: an earlier command got no reply within {timeout_s:g} s"))
