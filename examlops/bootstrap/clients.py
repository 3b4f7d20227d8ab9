"""The bus's protocol clients: one Redis port and one HTTP transport picked by a setting.

- ``bus_redis(settings)``: the ``RedisCommands`` port of a bus client or a
  bridge, redis-py with hiredis (``RedisPyCommands``).
- ``hop_client(settings)``: the bridge's one shared httpx client to serving,
  ``EXAMLOPS_BUS__HTTP_CLIENT``: ``aiohttp`` (httpx-aiohttp's,
  ``bus.aiohttp_transport``; the default) or ``library`` (httpx's own
  transport). Each keeps at most ``bus.concurrency`` connections, drops idle
  ones after ``bus.keepalive_s`` and retries nothing. Its headers
  (``hop_headers``) are the one place the bridge's own credential to serving
  goes; the per-job ``X-Examlops-Identity`` is the hop's.

Nothing connects until first used. ``bench/bus_vs_http.py --clients`` compares the HTTP paths; why the
default is what it is: ``bench/RESULTS.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from examlops.core.settings import Settings

if TYPE_CHECKING:
    import httpx

    from examlops.adapters.redis import RedisCommands


def bus_redis(settings: Settings) -> RedisCommands:
    from examlops.adapters.redis import RedisPyCommands

    return RedisPyCommands(settings.redis_url)


def hop_transport(settings: Settings) -> httpx.AsyncBaseTransport:
    import httpx

    bus = settings.bus
    if bus.http_client == "aiohttp":
        from examlops.bus.aiohttp_transport import AiohttpTransport

        return AiohttpTransport(max_connections=bus.concurrency, keepalive_expiry=bus.keepalive_s)
    limits = httpx.Limits(
        max_connections=bus.concurrency, max_keepalive_connections=bus.concurrency, keepalive_expiry=bus.keepalive_s
    )
    return httpx.AsyncHTTPTransport(limits=limits, retries=0)


def hop_headers(settings: Settings) -> dict[str, str]:
    """Headers on every post of the hop: the bridge's credential to serving (``bootstrap.identity.bridge_token``:
    the ``bridge`` identity's, which may relay the bus caller's identity); none when there is no token."""
    from examlops.bootstrap.identity import bridge_token

    token = bridge_token(settings)
    return {} if token is None else {"Authorization": f"Bearer {token}"}


def hop_client(settings: Settings) -> httpx.AsyncClient:
    from examlops.bus.hop_http import http_client

    return http_client(settings.http, hop_transport(settings), hop_headers(settings))
