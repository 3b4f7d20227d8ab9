"""The examlops adapter: an examlops serving tier over HTTP, by task or by model, with the caller's token,
budget and trace id.

A route's ``ExamlopsTarget`` names either a task (``POST /v1/tasks/{task}/infer`` and ``/stream``: the
site's task map picks model and alias) or a model with an optional alias or version
(``/v1/models/{model}/predict`` and ``/stream``). A row is sent as serving's instance as it is: the spec's
input fields must be serving's (``embedding``, ``node_count``, optionally ``job_id``); an unknown field is
serving's 422. The reply's ``prediction`` becomes the target's one output field (``outputs``); the
target's ``reply_fields`` (``model``, ``alias``, ``version``, ``run_id``, ``budget_remaining_ms``, ...) are
copied beside it when the reply (or a stream's chunk) carries them, so a caller that wants to know which
version answered declares those fields in its output model.

- One row: one call to the infer or predict route. Several rows: ONE call to the stream route
  (``instances``), whose NDJSON chunks are collected in order: native batching, and the same route gives
  ``stream_batches`` (one yielded list per chunk serving sends). A stream that ends without answering
  every row (its budget expired, or an error on its last line) fails the whole batch: never a partial
  result. ``max_batch`` (64 by default) keeps a stream of 384-float rows well under serving's 1 MiB body
  limit.
- Every call sends ``budget_ms`` = what remains of ``call.deadline`` when it is sent, rounded down (never
  more; no deadline, no budget), or ``call.options["budget_ms"]`` when that is less: a caller that gives
  serving a budget but waits longer for its answer (the CLI: a refusal is an answer, and the time to reach
  serving is not serving's to spend), ``Authorization: Bearer <token>`` (the adapter's, or ``call.options
  ["token"]``, the caller's) and ``X-Examlops-Trace: call.trace_id``. Serving adopts a trace id only from
  a relaying identity (``api.tracing``): for anyone else it makes its own, which the reply's
  ``X-Examlops-Trace`` names; ``served_trace()`` gives it after the call, and an error's message ends
  with it.
- Failures: ``wire`` maps statuses (422 validation; 401/403/404 precondition with serving's code; 503
  ``refused`` throttled with ``Retry-After``; other 5xx and connection errors infrastructure; 504 and the
  deadline timeout; 500 ``inference_failed`` model failure). A stream's last line is mapped by its
  error's code the same way; ``expired`` without an error is ``TIMEOUT``.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import quote

import httpx

from examlops.inference.adapters import codec
from examlops.inference.adapters.http_adapter import HttpAdapter
from examlops.inference.adapters.remote_config import ExamlopsRoute, ExamlopsSettings, settings_of, targets_of
from examlops.inference.adapters.wire import HttpBackend, error_of, malformed
from examlops.inference.errors import InferenceError, Kind
from examlops.inference.ports import Call, Capabilities, Row

BACKEND = "examlops"
TRACE_HEADER = "X-Examlops-Trace"
MAX_BUDGET_MS = 7 * 24 * 3600 * 1000.0  # serving's ceiling (core.budget.MAX_BUDGET_MS); the client needs no core

_served_trace: ContextVar[str | None] = ContextVar("examlops_inference_served_trace", default=None)

_KIND_BY_CODE = {
    "refused": Kind.THROTTLED,
    "inference_timeout": Kind.TIMEOUT,
    "deadline_exceeded": Kind.TIMEOUT,
    "invalid_input": Kind.VALIDATION,
    "payload_too_large": Kind.VALIDATION,
    "inference_failed": Kind.MODEL_FAILURE,
}


def served_trace() -> str | None:
    """The trace id serving gave the last call made in this context (its ``X-Examlops-Trace``)."""
    return _served_trace.get()


@dataclass(frozen=True, slots=True)
class ExamlopsTarget:
    """Where a route's calls go: a ``task``, or a ``model`` with an optional ``alias`` or ``version``."""

    adapter: ClassVar[str] = BACKEND
    task: str | None = None
    model: str | None = None
    alias: str | None = None
    version: int | None = None
    outputs: tuple[str, ...] = ("prediction",)
    """The output model's field that takes serving's ``prediction`` (one field)."""
    reply_fields: tuple[str, ...] = ()
    """Fields of serving's reply copied into each output row when present (a stream copies its chunk's)."""

    def __post_init__(self) -> None:
        if (self.task is None) == (self.model is None):
            raise ValueError("an examlops target names either a task or a model")
        if self.task is not None and (self.alias is not None or self.version is not None):
            raise ValueError("a task target takes no alias or version: the task map picks them")
        if self.alias is not None and self.version is not None:
            raise ValueError("give either an alias or a version")
        if len(self.outputs) != 1:
            raise ValueError("serving answers one prediction a row: name one output field")

    def path(self, kind: str) -> str:
        if self.task is not None:
            return f"/v1/tasks/{quote(self.task, safe='')}/{'infer' if kind == 'one' else 'stream'}"
        assert self.model is not None
        return f"/v1/models/{quote(self.model, safe='')}/{'predict' if kind == 'one' else 'stream'}"

    @classmethod
    def of(cls, raw: ExamlopsTarget | Mapping[str, Any]) -> ExamlopsTarget:
        """A target, or one from a wiring file's mapping (``task`` | ``model``, ``alias``, ``version``, ``outputs``,
        ``reply_fields``)."""
        if isinstance(raw, ExamlopsTarget):
            return raw
        return cls(**ExamlopsRoute.model_validate(dict(raw)).model_dump())

    def pins(self) -> dict[str, Any]:
        return {k: v for k, v in (("alias", self.alias), ("version", self.version)) if v is not None}

    def output_row(self, prediction: object, reply: Mapping[str, Any]) -> dict[str, Any]:
        """One output row: the prediction in ``outputs`` and the ``reply_fields`` the reply carries."""
        extra = {name: reply[name] for name in self.reply_fields if name in reply}
        return {**extra, **codec.output_row(prediction, self.outputs)}


def budget_ms(call: Call) -> float | None:
    """What remains of the call's deadline in milliseconds, rounded down, or the ``budget_ms`` option when
    that is less; None with neither. A ``budget_ms`` option that is not a positive number is VALIDATION."""
    declared = call.options.get("budget_ms")
    if declared is not None and (
        isinstance(declared, bool) or not isinstance(declared, int | float) or not 0 < declared <= MAX_BUDGET_MS
    ):
        raise InferenceError(
            Kind.VALIDATION,
            f"the budget_ms option must be more than 0 and at most {MAX_BUDGET_MS:.0f} ms",
            backend=BACKEND,
            route=call.route,
        )
    remaining = call.remaining_s()
    if remaining is None:
        return None if declared is None else float(declared)
    ms = min(math.floor(remaining * 1_000_000) / 1000, MAX_BUDGET_MS)
    if ms <= 0:
        raise InferenceError(Kind.TIMEOUT, "the deadline passed before the call", backend=BACKEND, route=call.route)
    return ms if declared is None else min(ms, float(declared))


class ExamlopsAdapter(HttpAdapter[ExamlopsTarget]):
    """An examlops serving tier at ``url``; ``routes`` maps each route to its target (module docstring)."""

    backend = BACKEND

    def __init__(
        self,
        url: str,
        routes: Mapping[str, ExamlopsTarget],
        *,
        token: str | None = None,
        max_batch: int = 64,
        default_timeout_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.token = token
        self.capabilities = Capabilities(
            native_batching=True, max_batch=max_batch, streaming=True, options=frozenset({"token", "budget_ms"})
        )
        super().__init__(
            routes, HttpBackend(url, backend=BACKEND, default_timeout_s=default_timeout_s, transport=transport)
        )

    def _headers(self, call: Call) -> dict[str, str]:
        headers = {}
        token = call.options.get("token", self.token)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if call.trace_id:
            headers[TRACE_HEADER] = call.trace_id
        return headers

    def _body(self, target: ExamlopsTarget, call: Call, **fields: Any) -> dict[str, Any]:
        budget = budget_ms(call)
        return {**fields, **target.pins(), **({"budget_ms": budget} if budget is not None else {})}

    def _failed(self, response: httpx.Response, route: str) -> InferenceError:
        error = error_of(response, backend=BACKEND, route=route, own_body=True)
        trace = response.headers.get(TRACE_HEADER)
        if trace:
            error.message = f"{error.message} [trace {trace}]"
        return error

    async def predict_batch(self, route: str, rows: Sequence[Row], call: Call) -> Sequence[Row]:
        target = self.batch_target(route, rows)
        if not rows:
            return []
        if len(rows) > 1:
            return [out for chunk in [c async for c in self.stream_batches(route, rows, call)] for out in chunk]
        body = self._body(target, call, **rows[0])
        response = await self._http.post(target.path("one"), call, json=body, headers=self._headers(call))
        _served_trace.set(response.headers.get(TRACE_HEADER))
        if response.status_code != 200:
            raise self._failed(response, route)
        try:
            reply = response.json()
            prediction = reply["prediction"]
        except (ValueError, KeyError, TypeError) as exc:
            raise malformed("no prediction", backend=BACKEND, route=route) from exc
        return [target.output_row(prediction, reply)]

    async def stream_batches(self, route: str, rows: Sequence[Row], call: Call) -> AsyncIterator[Sequence[Row]]:
        """One list of outputs per chunk serving sends, in order; the stream's end is checked (module docstring)."""
        target = self.batch_target(route, rows)
        body = self._body(target, call, instances=[dict(row) for row in rows])
        answered = 0
        async with self._http.stream_lines(target.path("many"), call, json=body, headers=self._headers(call)) as (
            response,
            lines,
        ):
            _served_trace.set(response.headers.get(TRACE_HEADER))
            if response.status_code != 200:
                raise self._failed(response, route)
            async for line in lines:
                if not line.strip():
                    continue
                message = _parse(line, route)
                if message.get("done") is True:
                    self._check_end(message, answered, len(rows), route)
                    return
                predictions = message.get("predictions")
                if message.get("start") != answered or not isinstance(predictions, list) or not predictions:
                    raise malformed("a chunk out of order", backend=BACKEND, route=route)
                answered += len(predictions)
                yield [target.output_row(p, message) for p in predictions]
        raise malformed("the stream ended without its last line", backend=BACKEND, route=route)

    def _check_end(self, end: Mapping[str, Any], answered: int, count: int, route: str) -> None:
        error = end.get("error")
        if isinstance(error, dict):
            code = str(error.get("code") or "")
            kind = _KIND_BY_CODE.get(code) or (
                Kind.MODEL_FAILURE if error.get("inference_failed") else Kind.INFRASTRUCTURE
            )
            message = str(error.get("error") or "the stream failed")[:256]
            raise InferenceError(kind, message, code=code or None, backend=BACKEND, route=route)
        if end.get("expired"):
            raise InferenceError(
                Kind.TIMEOUT,
                f"the budget ran out after {answered} of {count} rows",
                code="expired",
                backend=BACKEND,
                route=route,
            )
        if answered != count:
            raise malformed(f"{answered} of {count} rows answered", backend=BACKEND, route=route)


def _parse(line: str, route: str) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except ValueError as exc:
        raise malformed("a line that is not JSON", backend=BACKEND, route=route) from exc
    if not isinstance(message, dict):
        raise malformed("a line that is not an object", backend=BACKEND, route=route)
    return message


def examlops_adapter(
    targets: Mapping[str, ExamlopsTarget | Mapping[str, Any]],
    settings: Mapping[str, Any],
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> ExamlopsAdapter:
    """The wiring's factory (``register_adapter("examlops", examlops_adapter)``): every route wired to
    examlops, and the shared ``settings``: ``url`` (required), ``token``, ``max_batch``, ``default_timeout_s``."""
    shared = settings_of(ExamlopsSettings, BACKEND, settings)
    return ExamlopsAdapter(
        shared.url,
        targets_of(BACKEND, ExamlopsTarget.of, targets),
        token=shared.token,
        max_batch=shared.max_batch,
        default_timeout_s=shared.default_timeout_s,
        transport=transport,
    )
