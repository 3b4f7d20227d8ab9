"""What a request body must be before a route sees it, as pure ASGI middleware: JSON, and not too large.

- A body that is not JSON (``Content-Type`` neither ``application/json`` nor ``*/*+json``) gets a 415
  before a byte of it is read; a request without a body needs no content type. The Open Inference
  Protocol's infer routes (``/v2/models/{model}[/versions/{version}]/infer``) also take
  ``application/octet-stream`` (its binary tensor data extension) and no content type at all (what
  tritonclient sends: the protocol's body is JSON unless ``Inference-Header-Content-Length`` says otherwise),
  and their refusals carry the protocol's error body (``error``, ``code``, ``inference_failed``; no
  ``prediction``). The dashboard's routes (``/dashboard/...``) take HTML forms
  (``application/x-www-form-urlencoded``) besides JSON.
- A declared Content-Length over the limit is refused with a 413 before a byte is read; a chunked body is
  counted as it arrives and refused at the first chunk that crosses the limit. The application's own
  reply to a cut-off body is dropped.
- Both refusals carry ``connection: close``: the rest of the body is never read, so the connection is
  not kept alive for another request.
- The bytes of body received so far are kept in the scope (``received_bytes``) for the one log line a
  client's disconnect mid-body deserves.
"""

from __future__ import annotations

import contextlib
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from examlops.api.schemas import ErrorReply

RECEIVED = "examlops.received_bytes"
"""Scope key: a one-item list, the body bytes received so far (set for every HTTP request)."""

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class _BodyTooLarge(Exception):
    pass


def received_bytes(scope: Scope) -> int:
    counter = scope.get(RECEIVED)
    return int(counter[0]) if counter else 0


def is_json(content_type: bytes) -> bool:
    """``application/json`` or a ``+json`` type, any parameters (``; charset=utf-8``), any case."""
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


_V2_INFER = re.compile(r"/v2/models/[^/]+(?:/versions/[^/]+)?/infer")


def is_v2_infer(path: str) -> bool:
    """A path of the Open Inference Protocol's infer routes, whose errors carry no ``prediction``."""
    return _V2_INFER.fullmatch(path) is not None


DASHBOARD_FORMS = "/dashboard/"
"""The dashboard's pages post HTML forms (``application/x-www-form-urlencoded``): login, logout, actions."""


def accepts(path: str, content_type: bytes) -> bool:
    """Whether a body of ``content_type`` may reach the route at ``path`` (rules in the module docstring)."""
    if is_json(content_type):
        return True
    if path.startswith(DASHBOARD_FORMS):
        return content_type.split(b";", 1)[0].strip().lower() == b"application/x-www-form-urlencoded"
    if not is_v2_infer(path):
        return False
    media = content_type.split(b";", 1)[0].strip().lower()
    return media in (b"", b"application/octet-stream")


def _has_body(headers: dict[bytes, bytes]) -> bool:
    return b"transfer-encoding" in headers or headers.get(b"content-length", b"0").strip() not in (b"0", b"")


async def _refuse(send: Send, status: int, code: str, message: str, *, v2: bool = False) -> None:
    reply = ErrorReply(error=message, code=code, field="body")
    # The V2 error body (api.v2.schemas.V2ErrorReply): the protocol has no prediction on errors.
    kept = {"error", "code", "inference_failed"} if v2 else None
    body = reply.model_dump_json(include=kept).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        content_type = headers.get(b"content-type", b"")
        if scope["method"] in _BODY_METHODS and _has_body(headers) and not accepts(scope.get("path", ""), content_type):
            if is_v2_infer(scope.get("path", "")):
                message = "the body must be JSON, or application/octet-stream with Inference-Header-Content-Length"
                await _refuse(send, 415, "unsupported_media_type", message, v2=True)
            else:
                await _refuse(
                    send, 415, "unsupported_media_type", "the body must be JSON (Content-Type: application/json)"
                )
            return
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > self.max_bytes
            except ValueError:
                too_big = False
            if too_big:
                await self._too_large(send, scope)
                return

        counter = scope[RECEIVED] = [0]
        cut = False
        started = False

        async def limited_receive() -> Message:
            nonlocal cut
            message = await receive()
            if message["type"] == "http.request":
                counter[0] += len(message.get("body", b""))
                if counter[0] > self.max_bytes:
                    cut = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if cut:
                return
            started = True
            await send(message)

        with contextlib.suppress(_BodyTooLarge):
            await self.app(scope, limited_receive, guarded_send)
        if cut and not started:
            await self._too_large(send, scope)

    async def _too_large(self, send: Send, scope: Scope) -> None:
        message = f"the request body is larger than {self.max_bytes} bytes"
        await _refuse(send, 413, "payload_too_large", message, v2=is_v2_infer(scope.get("path", "")))
