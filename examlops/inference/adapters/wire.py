"""What every remote adapter shares: one ``httpx.AsyncClient``, requests bound to the call's deadline, and
the table from HTTP statuses and transport errors to the inference port's taxonomy.

``HttpBackend`` owns the client: ``start`` creates it (idempotent), ``close`` closes it (idempotent); a
request before ``start`` is ``PRECONDITION`` (``inference_adapter_not_started``). ``post`` and
``stream_lines`` give up at ``call.deadline``: a deadline already passed is ``TIMEOUT`` before any I/O,
and the whole exchange (connect, send, every read) runs under ``asyncio.timeout`` of what remains, so no
phase can extend it. Without a deadline the backend's ``default_timeout_s`` bounds the exchange.

Failure mapping (``error_of`` for a reply, ``transport_error`` for what httpx raises):

- 400, 422 -> ``VALIDATION``; 401, 403, 404, 409, 413, 415 and any other 4xx -> ``PRECONDITION``;
- 429, and 503 with code ``refused`` or a ``Retry-After`` -> ``THROTTLED`` (``retry_after_s`` from the
  header); 408, 504 and the deadline -> ``TIMEOUT``;
- 500 whose body says ``inference_failed: true`` -> ``MODEL_FAILURE``; any other 5xx, a refused or reset
  connection, a reply that is not what the protocol promises -> ``INFRASTRUCTURE``.

A batch over the adapter's declared ``max_batch`` is ``FeatureUnsupported`` before any I/O
(``check_batch``). The error's ``code`` is the body's ``code`` when it has one (examlops' bodies), else
``inference_<kind>``. Its message is the body's ``error`` cut to 256 characters only for examlops' own
bodies (``own_body=True``), which never echo the input; a third-party server's text (MLServer, Triton,
MLflow may echo the inputs) is dropped and the message is ``HTTP <status>``. httpx's exceptions are
chained with ``from``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx

from examlops.inference.errors import FeatureUnsupported, InferenceError, Kind
from examlops.inference.ports import Call, Capabilities

MAX_MESSAGE = 256
DEFAULT_TIMEOUT_S = 30.0


def _retry_after(response: httpx.Response) -> float | None:
    raw = response.headers.get("Retry-After")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None  # an HTTP date: rare from model servers; the policy's backoff decides then
    return value if math.isfinite(value) and value >= 0 else None


def _body(response: httpx.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def kind_of_status(status: int, body: Mapping[str, Any], retry_after: float | None) -> Kind:
    """The taxonomy's kind for an error reply (module docstring)."""
    if status in (400, 422):
        return Kind.VALIDATION
    if status in (408, 504):
        return Kind.TIMEOUT
    if status == 429 or (status == 503 and (body.get("code") == "refused" or retry_after is not None)):
        return Kind.THROTTLED
    if status == 500 and body.get("inference_failed") is True:
        return Kind.MODEL_FAILURE
    if status >= 500:
        return Kind.INFRASTRUCTURE
    return Kind.PRECONDITION


def error_of(
    response: httpx.Response, *, backend: str, route: str, kind: Kind | None = None, own_body: bool = False
) -> InferenceError:
    """The ``InferenceError`` for an error reply; ``kind`` overrides the table (an adapter that knows more).

    ``own_body``: the reply is examlops' own, whose ``error`` never echoes the input, so it is kept as the
    message; any other server's text may echo the input and is dropped (the message is the status)."""
    body = _body(response)
    retry_after = _retry_after(response)
    found = kind or kind_of_status(response.status_code, body, retry_after)
    code = body.get("code")
    message = body.get("error")
    own = message if own_body and isinstance(message, str) and message else None
    text = own[:MAX_MESSAGE] if own else f"HTTP {response.status_code}"
    return InferenceError(
        found,
        text,
        code=code if isinstance(code, str) and code else None,
        backend=backend,
        route=route,
        retry_after_s=retry_after if found is Kind.THROTTLED else None,
    )


def transport_error(exc: Exception, *, backend: str, route: str) -> InferenceError:
    """What httpx (or the deadline) raised, as the taxonomy's kind."""
    if isinstance(exc, (TimeoutError, httpx.TimeoutException)):
        return InferenceError(
            Kind.TIMEOUT, "the deadline passed before the backend answered", backend=backend, route=route
        )
    return InferenceError(
        Kind.INFRASTRUCTURE, f"the backend could not be reached ({type(exc).__name__})", backend=backend, route=route
    )


def malformed(what: str, *, backend: str, route: str) -> InferenceError:
    """A 200 reply that is not what the protocol promises: the backend is broken, not the caller."""
    return InferenceError(
        Kind.INFRASTRUCTURE,
        f"the backend's reply is malformed: {what}",
        code="inference_bad_reply",
        backend=backend,
        route=route,
    )


def check_batch(capabilities: Capabilities, count: int, *, backend: str, route: str) -> None:
    """``FeatureUnsupported`` (before any I/O) for a batch over the declared ``max_batch``."""
    if capabilities.max_batch is not None and count > capabilities.max_batch:
        raise FeatureUnsupported(f"batches over {capabilities.max_batch} rows", backend=backend, route=route)


class HttpBackend:
    """One HTTP client for one adapter; requests bound to the call's deadline (module docstring)."""

    def __init__(
        self,
        base_url: str,
        *,
        backend: str,
        headers: Mapping[str, str] | None = None,
        default_timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.backend = backend
        self.headers = dict(headers or {})
        self.default_timeout_s = default_timeout_s
        self._transport = transport  # tests fake the network here (httpx.MockTransport)
        self._client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        if self._client is None:
            self._client = httpx.AsyncClient(base_url=self.base_url, headers=self.headers, transport=self._transport)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def _budget_s(self, call: Call) -> float:
        remaining = call.remaining_s()
        if remaining is None:
            return self.default_timeout_s
        if remaining <= 0:
            raise InferenceError(
                Kind.TIMEOUT, "the deadline passed before the call", backend=self.backend, route=call.route
            )
        return remaining

    def _ready(self, call: Call) -> httpx.AsyncClient:
        if self._client is None:
            raise InferenceError(
                Kind.PRECONDITION,
                "the adapter is not started",
                code="inference_adapter_not_started",
                backend=self.backend,
                route=call.route,
            )
        return self._client

    async def post(
        self,
        path: str,
        call: Call,
        *,
        json: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """The reply to a POST, whatever its status, read whole within the deadline."""
        client = self._ready(call)
        budget = self._budget_s(call)
        try:
            async with asyncio.timeout(budget):
                return await client.post(path, json=json, content=content, headers=headers, timeout=budget)
        except (TimeoutError, httpx.HTTPError) as exc:
            raise transport_error(exc, backend=self.backend, route=call.route) from exc

    @asynccontextmanager
    async def stream_lines(
        self, path: str, call: Call, *, json: Any, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[tuple[httpx.Response, AsyncIterator[str]]]:
        """The reply to a streamed POST and its lines (an error reply is read whole first). Opening the
        stream and every line read end at the deadline; the deadline never spans the caller's own work
        between lines (a timeout around a ``yield`` would cancel the caller, not the read)."""
        client = self._ready(call)
        deadline = asyncio.get_running_loop().time() + self._budget_s(call)
        budget = deadline - asyncio.get_running_loop().time()

        async def lines(response: httpx.Response) -> AsyncIterator[str]:
            reader = response.aiter_lines()
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        line = await anext(reader)
                except StopAsyncIteration:
                    return
                yield line

        try:
            async with AsyncExitStack() as stack:
                async with asyncio.timeout_at(deadline):
                    response = await stack.enter_async_context(
                        client.stream("POST", path, json=json, headers=headers, timeout=budget)
                    )
                    if response.status_code != 200:
                        await response.aread()
                yield response, lines(response)
        except (TimeoutError, httpx.HTTPError) as exc:
            raise transport_error(exc, backend=self.backend, route=call.route) from exc
