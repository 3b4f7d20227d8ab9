"""The one Redis adapter: clients built from a URL, and redis-py's errors translated into ours.

Every Redis user (the bus, recording, the audit trail, the failure windows,
retrain requests, the drift flow's snapshot reads) gets its client here and
wraps its commands in ``translated(what)``:

- ``connect(url)``: a sync client (decoded strings; bytes that are not UTF-8
  become U+FFFD, so one hostile entry is an unreadable entry, not a client
  that raises on every read); ``connect_async(url)``: an asyncio one.
  Nothing connects until the first command. The asyncio client's commands
  are packed by hiredis (redis-py's own ``HiredisRespSerializer``, as its
  sync client does) rather than redis-py's asyncio loop in Python: the same
  bytes, a fifth of the CPU for a bus job's 20-30 arguments
  (``bench/RESULTS.md``). A connection error (refused,
  dropped, timed out) is retried briefly with backoff by
  redis-py's ``Retry``, also when the command was already sent (it may run
  twice: what is sent through these clients is safe to repeat).
- ``RedisCommands``: the port the bus store speaks, raw RESP2 replies;
  ``RedisPyCommands`` is its adapter over redis-py.
- ``translated(what)``: a refused, dropped or timed-out connection (and a
  Redis still loading its AOF, and uvloop's ``RuntimeError`` for a write on a
  connection already reset) becomes ``StoreUnavailable`` naming ``what``;
  other redis-py errors pass unchanged. It works around ``await`` too.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import (
    MasterDownError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.utils import HIREDIS_AVAILABLE

from examlops.core.errors import StoreUnavailable

CONNECT_TIMEOUT_S = 2.0
Arg = str | int | float | bytes
"""One argument of a Redis command."""


@dataclass(frozen=True, slots=True)
class LuaScript:
    """A Lua script and the SHA1 that EVALSHA names it by."""

    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest())


class RedisCommands(Protocol):
    """Redis commands with their raw RESP2 replies: strings decoded as UTF-8, None for nil, lists, ints.

    Errors are redis-py's classes: ``ConnectionError``/``TimeoutError`` when Redis cannot be reached or did not
    answer in time (connecting was retried with backoff first; a command that was in flight may have run, and
    an adapter may send it again), ``ResponseError`` for an error reply. ``aclose`` closes every connection.
    """

    async def execute(self, *args: Arg) -> Any:
        """One command's reply."""
        ...

    async def wait(self, *args: Arg) -> Any:
        """A command that blocks its connection (XREAD ... BLOCK): sent where it holds up no other command."""
        ...

    async def evalsha(self, script: LuaScript, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """EVALSHA of ``script``; a Redis that does not know it (NOSCRIPT, after a restart) is sent it first."""
        ...

    async def aclose(self) -> None: ...


def connect(url: str, *, socket_timeout_s: float = 5.0, retries: int = 2) -> redis.Redis:
    """A sync client (decoded strings) that retries connection errors briefly; nothing connects until used."""
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        encoding_errors="replace",
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=socket_timeout_s,
    )


_PLAIN = frozenset((str, bytes, int))
_hiredis = HiredisRespSerializer()
try:
    import hiredis  # its pack_command is what _hiredis.pack calls, after a pass of its own over the arguments
except ImportError:  # no hiredis: _HiredisPacked is never installed
    hiredis = None  # type: ignore[assignment]


class _HiredisPacked:
    """Mixed into redis-py's asyncio connection class: ``pack_command`` by hiredis (module docstring). An
    argument of another type (a float, whose text the two packers may write differently), or text that is
    not UTF-8, takes redis-py's own path, so Redis receives exactly what it would have."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if _PLAIN.issuperset(map(type, args)):  # in C: a bus job's commands have 20-30 arguments
            try:
                if type(args[0]) is str and " " not in args[0]:
                    return [hiredis.pack_command(args)]  # nothing for _hiredis.pack to split or convert
                packed: list[bytes] = _hiredis.pack(*args)
            except UnicodeEncodeError:  # a lone surrogate: redis-py's encoder replaces it
                pass
            else:
                return packed
        python: list[bytes] = super().pack_command(*args)  # type: ignore[misc]  # the connection class's
        return python


_packed_classes: dict[type, type] = {}


def _hiredis_packed(client: aioredis.Redis) -> aioredis.Redis:
    """``client`` with its pool's connections packing commands by hiredis, when hiredis is installed."""
    pool = client.connection_pool
    base = pool.connection_class
    if HIREDIS_AVAILABLE and not issubclass(base, _HiredisPacked):
        if base not in _packed_classes:
            _packed_classes[base] = type(f"HiredisPacked{base.__name__}", (_HiredisPacked, base), {})
        pool.connection_class = _packed_classes[base]
    return client


def connect_async(
    url: str, *, retries: int = 5, socket_timeout_s: float = 10.0, protocol: int | None = None
) -> aioredis.Redis:
    """An asyncio client that retries connection errors with backoff (0.05 s doubling to 1 s), its commands
    packed by hiredis (module docstring).

    ``socket_timeout_s`` must exceed every BLOCK sent on it; ``protocol``: RESP 2 or 3 (None: redis-py's default).
    A Redis that accepts connections and never answers (SIGSTOPped) holds a command for ``(retries + 1) ** 2``
    socket timeouts (6 min by default: redis-py 8.1 retries the handshake inside each retry of the command), so
    a caller with a deadline bounds its own call (``BusClient.request``); a cancelled command may still run.
    """
    client = aioredis.Redis.from_url(
        url,
        decode_responses=True,
        encoding_errors="replace",
        retry=AsyncRetry(ExponentialBackoff(cap=1.0, base=0.05), retries),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=socket_timeout_s,
        health_check_interval=30,
        protocol=protocol,
    )
    return _hiredis_packed(client)


async def evalsha_loading(
    execute: Callable[..., Awaitable[Any]], script: LuaScript, keys: Sequence[str], args: Sequence[Arg]
) -> Any:
    """EVALSHA of ``script`` through ``execute``; a Redis that forgot it (NOSCRIPT) is sent it and asked again."""
    try:
        return await execute("EVALSHA", script.sha, len(keys), *keys, *args)
    except NoScriptError:
        await execute("SCRIPT", "LOAD", script.source)
        return await execute("EVALSHA", script.sha, len(keys), *keys, *args)


class RedisPyCommands:
    """``RedisCommands`` over redis-py's asyncio client (``connect_async``), whose reply parsers are cleared so
    that every command answers its raw reply. Blocking reads take a connection of
    the pool of their own. Retries are redis-py's (see the module docstring).

    ``execute`` pipelines: the commands issued in one pass of the event loop (the replies of jobs that
    finished together, say) go to Redis as one redis-py pipeline, not a round trip and a pool checkout each;
    each caller gets its own reply or error. Every command sent here is safe to repeat, as a retried
    pipeline may repeat it. Why: ``bench/against_commit.py`` (figures in ``bench/RESULTS.md``).
    """

    def __init__(self, url: str, *, retries: int = 5, socket_timeout_s: float = 10.0) -> None:
        self.client = connect_async(url, retries=retries, socket_timeout_s=socket_timeout_s, protocol=2)
        self.client.response_callbacks.clear()  # this client's own table: raw RESP2 replies, parsed by the store
        self._command: Any = self.client.execute_command  # untyped in redis-py
        self._pending: list[tuple[tuple[Arg, ...], asyncio.Future[Any]]] = []
        self._sending: set[asyncio.Task[None]] = set()

    async def execute(self, *args: Arg) -> Any:
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Any] = loop.create_future()
        self._pending.append((args, reply))
        if len(self._pending) == 1:
            loop.call_soon(self._flush)
        return await reply

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.create_task(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[tuple[tuple[Arg, ...], asyncio.Future[Any]]]) -> None:
        try:
            if len(batch) == 1:
                results: list[Any] = [await self._command(*batch[0][0])]
            else:
                pipe: Any = self.client.pipeline(transaction=False)  # untyped in redis-py
                for args, _ in batch:
                    pipe.execute_command(*args)
                results = await pipe.execute(raise_on_error=False)
        except BaseException as exc:  # the connection failed (after redis-py's retries), or a bug: tell all
            for _, reply in batch:
                if reply.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    reply.cancel()
                else:
                    reply.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, reply), result in zip(batch, results, strict=True):
            if reply.done():  # its caller gave up (cancelled)
                continue
            if isinstance(result, Exception):
                reply.set_exception(result)
            else:
                reply.set_result(result)

    async def wait(self, *args: Arg) -> Any:
        return await self._command(*args)

    async def evalsha(self, script: LuaScript, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        return await evalsha_loading(self.execute, script, keys, args)

    async def aclose(self) -> None:
        """Cancel the commands still in flight (their callers gave up on a Redis that does not answer: nothing is
        sent again once closed; not awaited, see ``bus/bridge.py``), then close every connection."""
        for task in self._sending:
            task.cancel()
        await self.client.aclose()


TRANSIENT_REPLIES = frozenset({"OOM", "BUSY", "MASTERDOWN", "READONLY", "TRYAGAIN"})
"""Error replies of a Redis that will take the command later."""
_TRANSIENT_CLASSES = (OutOfMemoryError, ReadOnlyError, MasterDownError, TryAgainError)
_TRANSIENT_IN_SCRIPT = re.compile(r"(?:^|[\s:-])(" + "|".join(sorted(TRANSIENT_REPLIES)) + r")\b")


def transient_reply(error: ResponseError) -> bool:
    """Whether an error reply is one of a Redis that cannot take writes for now: redis-py's own classes for
    them (which drop the code from the message), the code first in the message, or the code inside the error of
    a Lua script (``Error running script ...: -OOM command not allowed ...``)."""
    if isinstance(error, _TRANSIENT_CLASSES):
        return True
    text = str(error)
    return text.split(" ", 1)[0] in TRANSIENT_REPLIES or (
        "script" in text and _TRANSIENT_IN_SCRIPT.search(text) is not None
    )


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """redis-py's connection errors (including a Redis still loading its AOF) become ``StoreUnavailable``, and
    so do the error replies of a Redis that cannot take writes for now (OOM, BUSY, MASTERDOWN, READONLY):
    both pass, so the callers' loops retry them."""
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        raise StoreUnavailable(f"Redis cannot be reached ({what}): {exc}") from exc
    except ResponseError as exc:
        if transient_reply(exc):
            raise StoreUnavailable(f"Redis cannot take this now ({what}): {exc}") from exc
        raise
    except RuntimeError as exc:
        if not closed_transport(exc):
            raise
        raise StoreUnavailable(f"Redis cannot be reached ({what}): the connection was closed under it") from exc


def closed_transport(error: RuntimeError) -> bool:
    """True for uvloop's error for a write on a connection the peer already reset (asyncio's loop raises an
    OSError there), which redis-py passes on unwrapped after dropping the connection: ``translated`` makes it
    ``StoreUnavailable``, retried like any lost connection. Any other ``RuntimeError`` is False (a bug)."""
    return "handler is closed" in str(error)
