"""The HTTP side of the bus hop: the bridge's one shared client, the headers of a hop, and what a timeout is.

``http_client`` is the one shared ``httpx.AsyncClient`` of a bridge, over the
transport ``bootstrap`` picks (``EXAMLOPS_BUS__HTTP_CLIENT``: httpx's own,
or ``aiohttp_transport``); ``hop.ModelHandler`` is the same on both. It keeps no
cookies: a cookie one reply set would ride along on every later job, whoever
sent it, and reading every reply for them is a sixth of the hop's CPU
(``bench/RESULTS.md``). ``trace_headers`` is the one place the
bridge says things about a call to serving (serving reads them in ``api.tracing.from_bridge`` only).
``hop_request`` builds a hop's request as the client's ``build_request`` would, less the merging the hop
never needs (half of that call's CPU per job: ``bench/cpu_per_op.py``). ``timed_out`` tells time running out
from a connection failing, on both transports. Nothing here connects until a request is sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

from examlops.core.settings import HttpSettings
from examlops.tracing.record import CHANNEL_HEADER, IDENTITY_HEADER, TRACE_HEADER

if TYPE_CHECKING:
    from httpx._client import UseClientDefault  # the type of httpx.USE_CLIENT_DEFAULT, not re-exported

JSON_HEADERS = {"content-type": "application/json"}


class _NoCookies(httpx.Cookies):
    """A cookie jar that stays empty: ``Set-Cookie`` in a reply is ignored, unread."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


class HopClient(httpx.AsyncClient):
    """``httpx.AsyncClient`` without cookies (module docstring): its jar is always empty and never filled."""

    @property
    def cookies(self) -> httpx.Cookies:
        return _NO_COOKIES

    @cookies.setter
    def cookies(self, cookies: object) -> None:
        return None


_NO_COOKIES = _NoCookies()


def http_client(
    http: HttpSettings, transport: httpx.AsyncBaseTransport, headers: dict[str, str] | None = None
) -> httpx.AsyncClient:
    """The one shared client of a bridge over ``transport``: ``http``'s timeouts (5 s connect, 10 s read),
    ``headers`` on every request (the bridge's own credential to serving, when it has one).

    No retry: the transport is given one (its pool, keep-alive and retries are the builder's; bootstrap keeps
    idle connections below serving's keep-alive and retries none). ``trust_env=False``: no proxy or netrc
    from the environment on this hop; no cookies (``HopClient``). Closing the client closes the transport.
    """
    return HopClient(
        timeout=httpx.Timeout(http.read_timeout_s, connect=http.connect_timeout_s),
        transport=transport,
        headers=headers,
        trust_env=False,
    )


def trace_headers(trace_id: str, identity: str = "") -> dict[str, str]:
    """The hop's headers for a bus job: its trace id (serving traces the call as a bus call under it) and the
    identity the bridge verified.

    The one place the bridge says things about a call to serving; serving reads them in
    ``api.tracing.from_bridge`` only.
    """
    headers = {**JSON_HEADERS, CHANNEL_HEADER: "bus"}
    if trace_id:
        headers[TRACE_HEADER] = trace_id
    if identity:
        headers[IDENTITY_HEADER] = identity
    return headers


def hop_request(
    client: httpx.AsyncClient,
    url: httpx.URL,
    content: bytes,
    headers: dict[str, str],
    timeout: httpx.Timeout | UseClientDefault = httpx.USE_CLIENT_DEFAULT,
) -> httpx.Request:
    """A POST of ``content`` to the absolute ``url``, for ``client.send``: the client's headers, then ``headers``
    (replacing a client header of the same name), and ``timeout`` (else the client's), as
    ``client.build_request`` makes it. Without its merging of a base URL, query parameters and cookies, which
    the hop has none of (``HopClient`` keeps no cookies)."""
    own = {name.lower().encode("ascii") for name in headers}
    merged = [(name, value) for name, value in client.headers.raw if name.lower() not in own]
    merged += [(name.encode("ascii"), value.encode("ascii")) for name, value in headers.items()]  # as httpx does
    chosen = timeout if isinstance(timeout, httpx.Timeout) else client.timeout
    return httpx.Request("POST", url, content=content, headers=merged, extensions={"timeout": chosen.as_dict()})


def timed_out(exc: BaseException) -> bool:
    """Whether time ran out, rather than the connection failing or the reply being unreadable.

    The aiohttp transport raises httpx's timeout classes with a ``TimeoutError`` cause; httpx's own
    transport chains httpcore's timeouts, which are not ``TimeoutError``s: there the httpx class decides.
    """
    return isinstance(exc, TimeoutError | httpx.TimeoutException) or isinstance(exc.__cause__, TimeoutError)
