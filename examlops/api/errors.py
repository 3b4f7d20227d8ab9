"""The one table from our errors to HTTP statuses, and the handlers that use it.

No bad input may yield a 500 or a 2xx, and no reply echoes the input back:
a validation error names the field and what was wrong with it, nothing more;
a name the caller sent (a model in the path, a route) appears as at most its
first 64 characters and "…", and no message is longer than 256 characters.
Errors that FastAPI and Starlette answer themselves (an unknown route, a
method the route does not take, any ``HTTPException``) get the same body as
ours, their headers (``Allow`` on a 405) kept. A client that goes away in the
middle of its body costs one log line, not a traceback.

Under ``/v2`` (the Open Inference Protocol) every error, ours or the
framework's, has the protocol's body: ``error``, ``code`` and
``inference_failed`` only (``V2_KEYS``), never a ``prediction``.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from examlops.api.limits import received_bytes
from examlops.api.schemas import ErrorReply
from examlops.core import errors
from examlops.core.budget import remaining_ms

log = logging.getLogger(__name__)

STATUS: tuple[tuple[type[errors.ExamlopsError], int], ...] = (
    # Most specific first: the first match wins.
    (errors.PayloadTooLarge, 413),
    (errors.InvalidInput, 422),
    (errors.Unauthenticated, 401),
    (errors.Forbidden, 403),
    (errors.NotFound, 404),
    (errors.Conflict, 409),
    (errors.NotReady, 503),
    (errors.Refused, 503),
    (errors.InferenceTimeout, 504),
    (errors.DeadlineExceeded, 504),
    (errors.InferenceFailed, 500),
    (errors.DependencyUnavailable, 503),
    (errors.ModelLoadError, 503),
)


def status_of(error: errors.ExamlopsError) -> int:
    for kind, status in STATUS:
        if isinstance(error, kind):
            return status
    return 500


PREFIX = 64
"""Characters of a caller's string an error reply may show."""
MAX_MESSAGE = 256


def shown(text: str, limit: int = PREFIX) -> str:
    """``text``, or its first ``limit`` characters and "…" when longer: how a caller's string is echoed."""
    return text if len(text) <= limit else text[:limit] + "…"


V2_KEYS = {"error", "code", "inference_failed"}
"""The fields of an error under the Open Inference Protocol's routes (``api.v2.schemas.V2ErrorReply``)."""


def is_v2(request: Request) -> bool:
    path = request.url.path
    return path == "/v2" or path.startswith("/v2/")


STATUS_TEXTS: dict[int, str] = {
    401: "no bearer token, or one that is not valid (the reply never says which)",
    403: "the identity lacks the permission the reply names",
    404: "unknown model, alias or version",
    408: "the request's headers or body came too slowly (the connection is closed)",
    413: "body over the size limit",
    415: "the body is not JSON",
    422: "the payload does not match the model's schema (never a model failure)",
    500: "the model raised or returned nothing (inference_failed: true)",
    503: "not ready, a dependency is unavailable, or refused: no placement can meet the budget (refused: budget, "
    "with the estimate and Retry-After) or it ran out, or would before an answer, while queued (refused: late); "
    "a refusal carries the call's budget_ms and budget_remaining_ms, as an answer does, and is a normal outcome",
    504: "the prediction ran past the hard limit, or the caller's deadline passed",
}
"""What each error status of an inference route means, for the OpenAPI docs."""


def documented(**overrides: str) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of an inference route: every status of ``STATUS_TEXTS`` with our error body, a text
    replaced where a route means more (``documented(s404="...")``)."""
    texts = STATUS_TEXTS | {int(key.removeprefix("s")): text for key, text in overrides.items()}
    return {status: {"model": ErrorReply, "description": text} for status, text in texts.items()}


def error_reply(error: errors.ExamlopsError, *, model: str | None = None, job_id: str | None = None) -> ErrorReply:
    """The body of ``error``'s reply (also the ``error`` of a stream's last line)."""
    message = error.message
    if error.field and not message.startswith(error.field):
        message = f"{error.field}: {message}"
    body = ErrorReply(
        error=shown(message, MAX_MESSAGE),
        code=error.code,
        field=None if error.field is None else shown(error.field),
        inference_failed=error.model_failure,
        model=None if model is None else shown(model),
        job_id=job_id,  # at most 128 characters (schemas.ShortText), and the caller's key to the reply
        permission=error.permission if isinstance(error, errors.Forbidden) else None,
    )
    if isinstance(error, errors.Refused):
        body.refused, body.estimate_ms = error.reason, error.estimate_ms
        body.budget_ms, body.budget_remaining_ms = error.budget_ms, remaining_ms(error.deadline, time.time())
    return body


def error_response(
    error: errors.ExamlopsError, *, model: str | None = None, job_id: str | None = None, v2: bool = False
) -> JSONResponse:
    body = error_reply(error, model=model, job_id=job_id)
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(error, errors.Unauthenticated) else None
    if isinstance(error, errors.Refused):
        headers = {"Retry-After": str(max(1, math.ceil(error.retry_after_s)))}
    content = body.model_dump(include=V2_KEYS) if v2 else body.model_dump()
    return JSONResponse(content, status_code=status_of(error), headers=headers)


def describe_validation(details: Sequence[Any]) -> tuple[str, str]:
    """(field, message) of the first validation problem, without the offending input."""
    first = details[0] if details else {}
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    field = ".".join(loc) or "body"
    kind = first.get("type", "")
    message = {
        "finite_number": "must be a finite number (NaN, Infinity and overflowing numbers are refused)",
        "float_type": "must be a number",
        "int_type": "must be an integer",
        "extra_forbidden": "is not a known field",
        "missing": "is required",
        "json_invalid": "the body is not valid JSON",
        "list_type": "must be a list of numbers",
        "too_long": "has too many values",
        "less_than_equal": f"must be at most {first.get('ctx', {}).get('le')}",
        "greater_than_equal": f"must be at least {first.get('ctx', {}).get('ge')}",
        "string_type": "must be a string",
    }.get(kind, str(first.get("msg", "is not valid")))
    return field, f"{field}: {message}"


async def handle_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    field, message = describe_validation(exc.errors())
    return error_response(errors.InvalidInput(message, field=field), v2=is_v2(request))


async def handle_examlops(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, errors.ExamlopsError)
    if status_of(exc) >= 500:
        log.warning("%s %s: %s", request.method, request.url.path, exc)
    return error_response(exc, v2=is_v2(request))


def _http_message(request: Request, exc: HTTPException) -> tuple[str, str]:
    """(code, message) of an error the framework raised; at most a short prefix of the path or method."""
    if exc.status_code == 404 and exc.detail == HTTPStatus.NOT_FOUND.phrase:
        return "not_found", f"no route {shown(request.url.path)!r}"
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "none")
        return "method_not_allowed", f"{request.method[:16]} is not allowed here (allowed: {allowed})"
    try:
        code = re.sub(r"[^a-z0-9]+", "_", HTTPStatus(exc.status_code).phrase.lower()).strip("_")
    except ValueError:
        code = f"http_{exc.status_code}"
    return code, shown(str(exc.detail), MAX_MESSAGE)


async def handle_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code in (204, 304):  # no body allowed
        return Response(status_code=exc.status_code, headers=exc.headers)
    code, message = _http_message(request, exc)
    body = ErrorReply(error=message, code=code)
    content = body.model_dump(include=V2_KEYS) if is_v2(request) else body.model_dump()
    return JSONResponse(content, status_code=exc.status_code, headers=exc.headers)


async def handle_disconnect(request: Request, exc: Exception) -> Response:
    """The client went away before its body was in: one line, and a reply nobody will read."""
    route = request.scope.get("route")
    where = getattr(route, "path", None) or shown(request.url.path)
    log.warning("%s %s: client disconnected after %d body bytes", request.method, where, received_bytes(request.scope))
    return Response(status_code=400)


async def handle_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    body = ErrorReply(error="internal error", code="internal_error")
    return JSONResponse(body.model_dump(include=V2_KEYS) if is_v2(request) else body.model_dump(), status_code=500)
