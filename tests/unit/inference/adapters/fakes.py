"""A fake network for the remote adapters: an ``httpx.MockTransport`` that records every request."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

Handler = Callable[[httpx.Request], httpx.Response | Awaitable[httpx.Response]]


class Network:
    """Answers each request with ``handler`` and keeps what was sent (``requests``, ``bodies``)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[httpx.Request] = []
        self.transport = httpx.MockTransport(self._handle)

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.handler(request)
        return answer if isinstance(answer, httpx.Response) else await answer

    @property
    def bodies(self) -> list[Any]:
        return [json.loads(r.content) for r in self.requests]


def reply(status: int, body: Any = None, headers: dict[str, str] | None = None) -> Handler:
    """A handler answering every request with ``status`` and the JSON ``body``."""
    return lambda request: httpx.Response(status, json=body, headers=headers)


def refuse(exc: type[httpx.TransportError]) -> Handler:
    """A handler that fails at the transport as ``exc``."""

    def handler(request: httpx.Request) -> httpx.Response:
        raise exc("fake", request=request)

    return handler
