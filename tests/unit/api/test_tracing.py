"""``api.tracing``: the trace header on every inference reply, one trace per call, and the bridge's headers."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from examlops.api.limits import BodyLimitMiddleware
from examlops.api.tracing import TraceMiddleware, adopt_bridge_claims, call_of, from_bridge, named_model
from examlops.bus.hop_http import trace_headers
from examlops.tracing import TRACE_HEADER, Tracer, TraceRecord, valid_trace_id


class Queue:
    """A ``TraceQueue`` that keeps what it is given."""

    def __init__(self) -> None:
        self.records: list[TraceRecord] = []

    def put(self, record: TraceRecord) -> bool:
        self.records.append(record)
        return True

    def start(self) -> None:
        pass

    def close(self, timeout_s: float = 10.0) -> None:
        pass


def app_with(queue: Queue) -> FastAPI:
    app = FastAPI()
    app.add_middleware(BodyLimitMiddleware, max_bytes=100)
    app.add_middleware(TraceMiddleware, tracer=Tracer(queue, node="n1"))

    @app.post("/relayed/predict")
    async def relayed(request: Request) -> JSONResponse:  # what auth does for a caller holding relay
        call = call_of(request)
        assert call is not None
        adopt_bridge_claims(call, request.scope)
        return JSONResponse({"prediction": 0.5, "error": None})

    @app.post("/m/{status}/predict")
    async def predict(status: int, request: Request) -> JSONResponse:
        await request.body()
        call = call_of(request)
        assert call is not None
        call.model = "JPCP"
        if status == 200:
            return JSONResponse({"prediction": 0.5, "error": None})
        code = {404: "model_not_found", 422: "invalid_input", 500: "inference_failed"}[status]
        return JSONResponse({"prediction": 0.0, "error": "no", "code": code}, status_code=status)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


async def post(
    app: FastAPI, path: str, content: bytes = b"{}", headers: dict[str, str] | None = None
) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        return await client.post(path, content=content, headers={"content-type": "application/json"} | (headers or {}))


@pytest.mark.parametrize(
    ("status", "outcome", "code"),
    [(200, "answered", ""), (404, "refused", "model_not_found"), (422, "refused", "invalid_input"),
     (500, "failed", "inference_failed")],
)  # fmt: skip
async def test_every_reply_carries_the_id_of_its_one_trace(status: int, outcome: str, code: str) -> None:
    queue = Queue()
    reply = await post(app_with(queue), f"/m/{status}/predict")
    assert reply.status_code == status
    [record] = queue.records
    assert reply.headers[TRACE_HEADER] == record.trace_id and valid_trace_id(record.trace_id)
    assert (record.channel, record.outcome, record.error_code, record.status, record.model, record.node) == (
        "http",
        outcome,
        code,
        status,
        "JPCP",
        "n1",
    )


async def test_a_body_over_the_limit_is_a_413_with_its_trace() -> None:
    queue = Queue()
    reply = await post(app_with(queue), "/m/200/predict", content=b"[" + b"1," * 100 + b"1]")
    assert reply.status_code == 413
    [record] = queue.records
    assert reply.headers[TRACE_HEADER] == record.trace_id
    assert (record.outcome, record.error_code, record.status) == ("refused", "payload_too_large", 413)


async def test_a_relayed_call_from_the_bridge_keeps_its_trace_id_and_is_a_bus_call() -> None:
    queue = Queue()
    given = "ab" * 16
    reply = await post(app_with(queue), "/relayed/predict", headers=trace_headers(given))
    assert reply.headers[TRACE_HEADER] == given
    assert (queue.records[0].trace_id, queue.records[0].channel) == (given, "bus")


async def test_a_caller_without_relay_cannot_claim_a_bridges_trace_id_or_channel() -> None:
    queue = Queue()
    given = "ab" * 16
    reply = await post(app_with(queue), "/m/200/predict", headers=trace_headers(given))
    assert reply.headers[TRACE_HEADER] != given
    assert (queue.records[0].trace_id, queue.records[0].channel) == (reply.headers[TRACE_HEADER], "http")


async def test_other_routes_are_not_traced() -> None:
    queue = Queue()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_with(queue)), base_url="http://t") as client:
        reply = await client.get("/healthz")
    assert TRACE_HEADER not in reply.headers and queue.records == []


def test_only_the_bridges_channel_header_carries_a_trace_id_in() -> None:
    def scope(headers: dict[str, str]) -> dict[str, object]:
        return {"headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}

    assert from_bridge(scope(trace_headers("cd" * 16))) == ("bus", "cd" * 16)
    assert from_bridge(scope({TRACE_HEADER: "cd" * 16})) == ("http", None)
    tracer = Tracer(None)
    assert tracer.begin(*from_bridge(scope(trace_headers("not-an-id")))).trace_id != "not-an-id"


def test_a_body_that_failed_validation_is_traced_under_the_model_it_names() -> None:
    assert named_model(b'{"model": "JPCP", "embedding": [1]}') == "JPCP"
    assert named_model(b'{"model": 3}') is None
    assert named_model(b"[1, 2]") is None
    assert named_model(b"not json") is None
    assert named_model(b'{"model": "' + b"x" * 500 + b'"}') == "x" * 128
