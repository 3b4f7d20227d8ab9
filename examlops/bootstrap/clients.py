"""The bus's protocol clients, picked by the settings' switches: one Redis port and one HTTP transport.

- ``bus_redis(settings)``: the ``RedisCommands`` port of a bus client or a bridge,
  ``EXAMLOPS_BUS__REDIS_CLIENT``: ``library`` (redis-py, ``RedisPyCommands``),
  ``lean`` (``PipelinedRedis``), ``auto`` (lean for a ``redis://`` URL, else
  library). ``ConfigError`` for ``lean`` with a TLS or Unix-socket URL.
- ``hop_client(settings)``: the bridge's one shared httpx client to serving,
  ``EXAMLOPS_BUS__HTTP_CLIENT``: ``aiohttp`` (httpx-aiohttp's,
  ``bus.aiohttp_transport``; the default) or ``library`` (httpx's own
  transport). Each keeps at most ``bus.concurrency`` connections, drops idle
  ones after ``bus.keepalive_s`` and retries nothing.

Nothing connects until first used. ``bench/bus_vs_http.py --clients`` compares the paths; why the defaults
are what they are: ``bench/RESULTS.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from examlops.core.errors import ConfigError
from examlops.core.settings import Settings

if TYPE_CHECKING:
    import httpx

    from examlops.adapters.redis import RedisCommands


def bus_redis(settings: Settings) -> RedisCommands:
    from examlops.adapters.redis import RedisPyCommands
    from examlops.bus.redis_pipe import PipelinedRedis, speaks

    choice, url = settings.bus.redis_client, settings.redis_url
    if choice == "lean" and not speaks(url):
        raise ConfigError(
            "EXAMLOPS_BUS__REDIS_CLIENT=lean speaks plain TCP (a redis:// URL) only; "
            "use library (or auto) for a TLS or Unix-socket Redis"
        )
    if choice == "lean" or (choice == "auto" and speaks(url)):
        return PipelinedRedis.from_url(url)
    return RedisPyCommands(url)


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


def hop_client(settings: Settings) -> httpx.AsyncClient:
    """The hop's client; it presents the platform token (``bootstrap.identity.platform_token``) to serving."""
    from examlops.bootstrap.identity import platform_token
    from examlops.bus.hop import http_client

    client = http_client(settings.http, hop_transport(settings))
    token = platform_token(settings)
    if token is not None:
        client.headers["Authorization"] = f"Bearer {token}"
    return client
