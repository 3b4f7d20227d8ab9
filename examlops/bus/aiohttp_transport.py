"""``AiohttpTransport``: httpx-aiohttp's transport under the bridge's httpx client, with its errors told apart.

httpx-aiohttp (by an httpx maintainer) moves the bytes with aiohttp; this
wraps it for the hop (``EXAMLOPS_BUS__HTTP_CLIENT=aiohttp``):

- The reply is read whole here, so every failure surfaces from
  ``handle_async_request`` and the aiohttp connection goes back to its pool
  at once (bodies are small JSON on this hop).
- Errors are httpx's, chained to aiohttp's, and decided by that cause:
  time running out stays httpx's timeout class (its cause a ``TimeoutError``);
  a connection that cannot be opened is ``ConnectError``; a connection lost
  or a reply that is not readable HTTP is ``RemoteProtocolError``. The
  library itself maps a refused connection and a server that hung up to
  ``ConnectTimeout`` (httpx-aiohttp 0.2.0), and lets a malformed reply escape
  as aiohttp's own error.
- No retry; at most ``max_connections`` connections, idle ones dropped after
  ``keepalive_expiry`` seconds (aiohttp's connector).
"""

from __future__ import annotations

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport as _LibraryTransport


class AiohttpTransport(httpx.AsyncBaseTransport):
    def __init__(self, *, max_connections: int = 64, keepalive_expiry: float = 4.0) -> None:
        limits = httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=keepalive_expiry,
        )
        self._inner = _LibraryTransport(limits=limits, trust_env=False, retries=0)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await self._inner.handle_async_request(request)
            try:
                await response.aread()  # read here, into the library's own response: no second one is built
            finally:
                await response.aclose()
        except (httpx.TransportError, aiohttp.ClientError) as exc:
            translated = _translated(exc)
            if translated is exc:
                raise
            raise translated from _cause(exc)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def _cause(exc: Exception) -> BaseException:
    """aiohttp's error: the cause of the library's httpx error, or the aiohttp error that escaped it."""
    return exc.__cause__ if isinstance(exc, httpx.TransportError) and exc.__cause__ is not None else exc


def _translated(exc: Exception) -> Exception:
    """The httpx error ``exc`` should have been (``exc`` itself when the library's class fits)."""
    cause = _cause(exc)
    if isinstance(cause, TimeoutError):
        return exc if isinstance(exc, httpx.TimeoutException) else httpx.ReadTimeout(str(cause) or "timed out")
    if isinstance(exc, httpx.TransportError) and not isinstance(exc, httpx.TimeoutException):
        return exc  # ConnectError, ReadError, UnsupportedProtocol...: the class fits
    if isinstance(cause, aiohttp.ClientConnectorError):
        return httpx.ConnectError(f"cannot connect: {cause}")
    return httpx.RemoteProtocolError(f"the connection failed or the reply is not readable HTTP/1.1: {cause}")
