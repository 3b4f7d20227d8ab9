"""uvicorn's HTTP/1.1 protocol with the deadlines it lacks: ``guarded_protocol(limits)``.

uvicorn (0.54, httptools) arms a timer only between requests (``timeout_keep_alive``): a connection that
never sends a byte, one that sends its headers a byte at a time, and one that trickles its body are all
held open for ever, and its ``limit_concurrency`` answers 503 only once a request's headers are in. This
subclass adds, per connection:

- a header deadline (``header_timeout_s``), from the connection's opening and from the first byte of
  each later request, to the end of its headers: past it the connection is closed, with a 408 when part
  of a request came;
- a body deadline (``body_timeout_s``), from the end of the headers to the end of the body: past it the
  connection is closed (with a 408 unless the app already answered); the app's ``receive`` then gives
  ``http.disconnect``;
- a cap on open connections (``max_connections``): the one over it gets a 503 with our error body and
  is closed before any of its bytes is read;
- bytes that are not HTTP get a 400 with our error body instead of uvicorn's plain text;
- the time its first bytes were read, in the request's state (``RECEIVED_AT``): a call's budget counts from
  there, so the time a request waited for the event loop before its handler ran is spent from it too (and,
  for a request pipelined behind another on its connection, the time it waited for that one's answer;
  time its bytes spent in the socket's buffer before the loop read them is not counted).

A refusal is written, the write side shut (``write_eof``) and what the peer still sends discarded for
``LINGER_S`` before the socket closes: closing at once, with the peer's bytes unread, makes the kernel send
a reset that can destroy the refusal before the peer reads it. Idle keep-alive connections are reaped by
uvicorn's own ``timeout_keep_alive``. Everything else (parsing,
pipelining, flow control) is uvicorn's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from examlops.api.schemas import ErrorReply

log = logging.getLogger(__name__)

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 503: b"Service Unavailable"}
RECEIVED_AT = "examlops_received_at"
"""The key in a request's state (``scope["state"]``) of the ``time.time()`` its first bytes were read."""
LINGER_S = 1.0
"""How long a refused connection's incoming bytes are read and dropped before the socket closes."""

Phase = Literal["idle", "head", "body"]
"""Where the connection's current request is: none or answered, its head arriving, its body arriving."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int


def raw_error(status: int, code: str, message: str) -> bytes:
    """A whole HTTP/1.1 response with our error body and ``connection: close``, for the protocol to write."""
    body = ErrorReply(error=message, code=code).model_dump_json().encode()
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % (
        status,
        _REASONS[status],
        len(body),
    )
    return head + body


class GuardedHttpProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` with header and body deadlines and a connection cap (see the module docstring).

    A deadline is armed only when a read leaves a request incomplete, so a request that arrives whole in
    one read (nearly all of them) costs no timer.
    """

    limits: ClassVar[ConnectionLimits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._armed_for: Phase | None = None
        self._phase: Phase = "idle"
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            log.info("connection refused: %d open, the cap is %d", len(self.connections), self.limits.max_connections)
            # Closed at once, no linger: at the cap every descriptor counts, and the peer has sent nothing yet.
            self._refused = True
            transport.write(raw_error(503, "too_many_connections", "serving has too many open connections"))
            transport.close()
            return
        self._arm("head")  # a new connection has until the header deadline to send a whole request head

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # the refusal is on its way; what the peer still sends is dropped
        super().data_received(data)
        if self._phase in ("head", "body") and self._armed_for != self._phase and not self.transport.is_closing():
            self._arm(self._phase)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = "head"
        self.scope["state"][RECEIVED_AT] = time.time()

    def on_headers_complete(self) -> None:
        self._phase = "body"
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._phase = "idle"
        self._disarm()
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        """A request that is not HTTP: our error body rather than uvicorn's plain text, then close."""
        self._refuse(raw_error(400, "bad_request", msg))

    def _refuse(self, response: bytes) -> None:
        """Write ``response``, shut the write side, drop what still comes, close after ``LINGER_S``."""
        self._refused = True
        self._disarm()
        self.transport.write(response)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)

    def _arm(self, phase: Phase) -> None:
        self._disarm()
        late = self._headers_late if phase == "head" else self._body_late
        delay = self.limits.header_timeout_s if phase == "head" else self.limits.body_timeout_s
        self._deadline = self.loop.call_later(delay, late)
        self._armed_for = phase

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._armed_for = None

    def _headers_late(self) -> None:
        self._deadline = self._armed_for = None
        if self.transport.is_closing():
            return
        answering = self.cycle is not None and not self.cycle.response_complete  # a pipelined earlier request
        if self._phase == "head" and not answering:
            log.info("request headers not complete after %.1f s: connection closed", self.limits.header_timeout_s)
            self._refuse(raw_error(408, "request_timeout", "the request headers came too slowly"))
            return
        self.transport.close()

    def _body_late(self) -> None:
        self._deadline = self._armed_for = None
        if self.transport.is_closing():
            return
        log.info("request body not complete after %.1f s: connection closed", self.limits.body_timeout_s)
        if self.cycle is not None and not self.cycle.response_started:
            # The app's later sends are dropped and its pending receive gives http.disconnect.
            self.cycle.disconnected = True
            self.cycle.message_event.set()
            self._refuse(raw_error(408, "request_timeout", "the request body came too slowly"))
            return
        self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpProtocol]:
    """A ``GuardedHttpProtocol`` class bound to ``limits``, for ``uvicorn.Config(http=...)``."""
    return type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"limits": limits})
