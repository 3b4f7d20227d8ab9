"""The trace of every inference call over HTTP, as pure ASGI middleware.

For a POST to an inference route (a path ending in ``/infer`` or ``/predict``, or a stream's ``/stream``: one
trace for the whole stream), ``TraceMiddleware``:

- opens a ``CallTrace`` before anything else runs (so a 413 from the body limit or an unexpected error is
  traced too) and puts it where the route finds it (``call_of(request)``); a call from the bridge
  (``X-Examlops-Channel: bus``, read by ``from_bridge`` only) keeps the bridge's trace id
  (``X-Examlops-Trace``) and is traced as a bus call;
- adds ``X-Examlops-Trace`` to the reply, whatever its status;
- once the reply is sent, finishes the trace: answered for a 200, else refused or failed as the error
  body's ``code`` says (``tracing.outcome_of``); a stream that stopped early notes its code on the call
  (``CallTrace.ended``), which then decides. The route notes model, alias, version and job id on the
  call, and hands the pipeline ``call.facts`` for queue wait, batch and predict time.

The request and reply bodies are kept for the payload policy only when it keeps something.
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from examlops.tracing import CHANNEL_HEADER, IDENTITY_HEADER, TRACE_HEADER, CallTrace, Tracer, valid_trace_id
from examlops.tracing.record import Channel

_STATE_KEY = "examlops.trace"
_TRACE_HEADER = TRACE_HEADER.lower().encode()
_CHANNEL_HEADER = CHANNEL_HEADER.lower().encode()
_IDENTITY_HEADER = IDENTITY_HEADER.lower().encode()


def is_inference(scope: Scope) -> bool:
    path: str = scope.get("path", "")
    return scope.get("method") == "POST" and path.endswith(("/infer", "/predict", "/stream"))


def from_bridge(scope: Scope) -> tuple[Channel, str | None]:
    """The channel and trace id a call claims (``bus.hop_http.trace_headers`` writes them): ``("bus", id)`` for
    a call the bridge forwarded, else ``("http", None)``.

    With ``relayed_identity``, the one place that reads what a bridge says about a call. Believed only of a
    caller holding ``relay`` (``adopt_bridge_claims``): anyone else's call keeps its own fresh id and the
    ``http`` channel, so no caller can fold its call into another's trace.
    """
    headers = dict(scope.get("headers", ()))
    if headers.get(_CHANNEL_HEADER) != b"bus":
        return "http", None
    return "bus", headers.get(_TRACE_HEADER, b"").decode("latin-1")


def relayed_identity(scope: Scope) -> str | None:
    """The identity a bridge says a bus call is for (``bus.hop_http.trace_headers``: ``X-Examlops-Identity``), at
    most 128 characters; the caller must hold ``relay`` for it to count (``api.auth.acting_identity``)."""
    for name, value in scope.get("headers", ()):
        if name == _IDENTITY_HEADER:
            return value.decode("latin-1")[:128] or None
    return None


def adopt_bridge_claims(call: CallTrace, scope: Scope) -> None:
    """A relaying caller's call (the bridge's): the channel and trace id it claims (``from_bridge``) become
    the call's, a trace id that is not one (``valid_trace_id``) aside."""
    channel, given = from_bridge(scope)
    if channel == "bus":
        call.channel = "bus"
        if valid_trace_id(given):
            call.trace_id = given  # type: ignore[assignment]  # valid_trace_id checked it is a str


def call_of(request: Request) -> CallTrace | None:
    """The trace of the call ``request`` belongs to (None off the inference routes)."""
    state = request.scope.get("state")
    return state.get(_STATE_KEY) if isinstance(state, dict) else None


class TraceMiddleware:
    def __init__(self, app: ASGIApp, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_inference(scope):
            await self.app(scope, receive, send)
            return
        call = self.tracer.begin("http")  # a bridge's channel and id are adopted once its caller holds relay
        scope.setdefault("state", {})[_STATE_KEY] = call
        keep = self.tracer.policy.keeps
        body_in: list[bytes] = []
        body_out: list[bytes] = []
        status = 0

        async def traced_receive() -> Message:
            message = await receive()
            if keep and message["type"] == "http.request":
                body_in.append(message.get("body", b""))
            return message

        async def traced_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                message["headers"] = [*message.get("headers", ()), (_TRACE_HEADER, call.trace_id.encode())]
            elif message["type"] == "http.response.body" and (keep or status != 200):
                body_out.append(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, traced_receive if keep else receive, traced_send)
        finally:
            output = b"".join(body_out)
            code = call.ended if status == 200 else _error_code(output, status)
            self.tracer.finish(call, error_code=code, status=status, input=b"".join(body_in), output=output)


def _error_code(body: bytes, status: int) -> str:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    code = data.get("code") if isinstance(data, dict) else None
    return code if isinstance(code, str) and code else f"http_{status or 500}"


def named_model(raw: bytes) -> str | None:
    """The model a body that failed validation names (for its trace), when it is a JSON object naming one."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model[:128] if isinstance(model, str) and model else None
