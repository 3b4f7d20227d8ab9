"""`POST /v1/tasks/{task}/stream` and `/v1/models/{model}/stream` against a fake pipeline."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from starlette.types import Message

from examlops.api.app import create_app
from examlops.core.errors import InferenceFailed, Refused
from examlops.core.messages import InferenceRequest, InferenceResult
from examlops.core.settings import Settings
from examlops.registry.catalog import load_catalog
from examlops.tasks.resolver import TaskResolver
from examlops.tracing import CallTrace, Tracer
from tests.unit.api.test_ingress import FakePipeline
from tests.unit.tasks.fakes import InMemoryTaskMap

CHUNK = 8


@dataclass
class StreamingPipeline(FakePipeline):
    """Answers ``node_count`` as the prediction; later instances finish first, so order is the route's doing.

    ``refuse_from``: instances at or past this index (in the order submitted) are refused with
    ``refusal``; ``done`` and ``cancelled`` count what became of each request."""

    refuse_from: int | None = None
    refusal: Exception = field(default_factory=lambda: Refused("no placement", reason="budget", estimate_ms=900.0))
    submitted: int = 0
    done: int = 0
    cancelled: int = 0

    async def infer(self, request: InferenceRequest) -> InferenceResult:
        index = self.submitted
        self.submitted += 1
        self.seen.append(request)
        try:
            for _ in range(CHUNK - index % CHUNK):  # the first of a batch takes longest
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.fail_with is not None and index >= CHUNK:
            raise self.fail_with
        if self.refuse_from is not None and index >= self.refuse_from:
            raise self.refusal
        self.done += 1
        spec = self.catalog.get(request.model)
        return InferenceResult(spec.name, request.alias or "Production", "1", "run-1", float(request.node_count))


@pytest.fixture
def settings(state_dir: Path) -> Settings:
    return Settings(home=state_dir, batch={"max_size": CHUNK}, predict={"workers": 1})


@pytest.fixture
def pipeline(settings: Settings) -> StreamingPipeline:
    return StreamingPipeline(load_catalog(settings.catalog_path))


class RecordingTracer(Tracer):
    def __init__(self) -> None:
        super().__init__(None)
        self.finished: list[tuple[CallTrace, str | None]] = []

    def finish(self, call: CallTrace, *, error_code: str | None, **kwargs: Any) -> None:
        self.finished.append((call, error_code))


@pytest.fixture
def tracer() -> RecordingTracer:
    return RecordingTracer()


@pytest.fixture
def app(settings: Settings, pipeline: StreamingPipeline, tracer: RecordingTracer) -> Any:
    tasks = InMemoryTaskMap()
    tasks.map("pavement.distress.jpcp", "JPCP", "Production")
    return create_app(
        settings, pipeline, CollectorRegistry(), identities=None, tasks=TaskResolver(tasks, ttl_s=0.0), tracer=tracer
    )


@pytest.fixture
async def client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serving") as c:
        yield c


def instances(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"embedding": [0.1] * 384, "node_count": i + 1, **extra} for i in range(n)]


def lines(reply: httpx.Response) -> list[dict[str, Any]]:
    assert reply.headers["content-type"] == "application/x-ndjson"
    return [json.loads(line) for line in reply.text.splitlines()]


async def test_chunks_come_in_order_one_per_batch_and_a_last_line_counts_them(
    client: httpx.AsyncClient, pipeline: StreamingPipeline, tracer: RecordingTracer
) -> None:
    reply = await client.post("/v1/tasks/pavement.distress.jpcp/stream", json={"instances": instances(20)})
    assert reply.status_code == 200, reply.text
    *chunks, end = lines(reply)
    assert [(c["chunk"], c["start"], len(c["predictions"])) for c in chunks] == [(0, 0, 8), (1, 8, 8), (2, 16, 4)]
    assert [p for c in chunks for p in c["predictions"]] == [float(i + 1) for i in range(20)]
    assert {(c["model"], c["alias"]) for c in chunks} == {("JPCP", "Production")}
    assert chunks[0]["versions"] == ["1"] * 8 and "job_ids" not in chunks[0]
    assert end == {
        "done": True,
        "answered": 20,
        "instances": 20,
        "expired": False,
        "budget_ms": None,
        "budget_remaining_ms": None,
        "error": None,
    }
    assert {(r.model, r.alias, r.routed, r.task) for r in pipeline.seen} == {
        ("JPCP", "Production", True, "pavement.distress.jpcp")
    }
    [(call, code)] = tracer.finished
    assert (code, call.model, call.alias, call.version) == (None, "JPCP", "Production", "1")


async def test_every_instance_carries_the_streams_deadline_and_budget_and_chunks_say_what_is_left(
    client: httpx.AsyncClient, pipeline: StreamingPipeline
) -> None:
    reply = await client.post(
        "/v1/models/jpcp/stream",
        json={"instances": instances(10, job_id="j"), "alias": "canary"},
        headers={"X-Examlops-Budget-Ms": "60000"},
    )
    *chunks, end = lines(reply)
    assert 0 < chunks[0]["budget_remaining_ms"] <= 60000 and chunks[0]["job_ids"] == ["j"] * 8
    assert (end["answered"], end["budget_ms"]) == (10, 60000)
    assert len({r.deadline for r in pipeline.seen}) == 1 and pipeline.seen[0].deadline is not None
    assert {(r.alias, r.routed, r.budget_ms) for r in pipeline.seen} == {("canary", True, 60000)}  # as route() drew it


async def test_a_stream_whose_first_chunk_is_refused_is_refused_like_a_single_call(
    client: httpx.AsyncClient, pipeline: StreamingPipeline
) -> None:
    pipeline.refuse_from = 0
    reply = await client.post("/v1/tasks/pavement.distress.jpcp/stream", json={"instances": instances(40)})
    assert reply.status_code == 503
    assert reply.headers["content-type"] == "application/json" and "retry-after" in reply.headers
    data = reply.json()
    assert (data["code"], data["refused"], data["estimate_ms"]) == ("refused", "budget", 900.0)
    await asyncio.sleep(0)
    assert pipeline.done == 0 and pipeline.submitted < 40


async def test_a_stream_is_admitted_once_for_its_first_chunk_and_every_row_is_sent_admitted(
    client: httpx.AsyncClient, pipeline: StreamingPipeline
) -> None:
    reply = await client.post(
        "/v1/models/jpcp/stream", json={"instances": instances(20)}, headers={"X-Examlops-Budget-Ms": "60000"}
    )
    assert reply.status_code == 200
    [(first, rows)] = pipeline.admitted
    assert (first.node_count, rows, first.budget_ms) == (1, CHUNK, 60000)
    assert len(pipeline.seen) == 20 and all(request.admitted for request in pipeline.seen)


async def test_a_stream_refused_at_its_start_is_answered_and_traced_as_a_refused_single_call_is(
    client: httpx.AsyncClient, pipeline: StreamingPipeline, tracer: RecordingTracer
) -> None:
    refusal = Refused("no placement", reason="budget", estimate_ms=900.0)
    pipeline.refuse_admission = refusal
    pipeline.refuse_from, pipeline.refusal = 0, refusal  # the single call is refused by infer, as serving does
    headers = {"X-Examlops-Budget-Ms": "500"}
    single = await client.post("/v1/tasks/pavement.distress.jpcp/infer", json=instances(1)[0], headers=headers)
    streamed = await client.post(
        "/v1/tasks/pavement.distress.jpcp/stream", json={"instances": instances(40)}, headers=headers
    )
    assert single.status_code == streamed.status_code == 503
    assert single.headers["retry-after"] == streamed.headers["retry-after"]
    assert streamed.json() == single.json()
    assert pipeline.submitted == 1  # the single call; no row of the stream was sent
    (one, one_code), (stream, stream_code) = tracer.finished

    def traced(call: CallTrace) -> tuple[object, ...]:
        return (call.task, call.model, call.alias, call.identity, call.budget_ms, call.deadline is None, call.ended)

    assert one_code == stream_code == "refused"
    assert (
        traced(stream)
        == traced(one)
        == ("pavement.distress.jpcp", "JPCP", "Production", "system:auth-off", 500, False, None)
    )


async def test_a_budget_that_runs_out_mid_way_ends_with_an_expired_line_counting_the_answered(
    client: httpx.AsyncClient, pipeline: StreamingPipeline, tracer: RecordingTracer
) -> None:
    pipeline.refuse_from, pipeline.refusal = 20, Refused("ran out while queued", reason="late")
    reply = await client.post("/v1/tasks/pavement.distress.jpcp/stream", json={"instances": instances(64)})
    assert reply.status_code == 200
    *chunks, end = lines(reply)
    assert [c["start"] for c in chunks] == [0, 8]
    assert (end["done"], end["expired"], end["answered"], end["instances"], end["error"]) == (True, True, 16, 64, None)
    [(call, code)] = tracer.finished
    assert (code, call.task, call.model) == ("refused", "pavement.distress.jpcp", "JPCP")


async def test_a_model_failure_mid_way_ends_the_stream_with_the_error_naming_the_instance(
    client: httpx.AsyncClient, pipeline: StreamingPipeline
) -> None:
    pipeline.fail_with = InferenceFailed("the model raised")
    reply = await client.post("/v1/models/JPCP/stream", json={"instances": instances(20)})
    *chunks, end = lines(reply)
    assert len(chunks) == 1
    assert (end["answered"], end["expired"], end["error"]["code"], end["error"]["inference_failed"]) == (
        8,
        False,
        "inference_failed",
        True,
    )


async def test_a_bad_instance_is_a_422_naming_its_index(client: httpx.AsyncClient) -> None:
    body = {"instances": [*instances(3), {"embedding": [1.0], "node_count": 0}]}
    reply = await client.post("/v1/tasks/pavement.distress.jpcp/stream", json=body)
    assert reply.status_code == 422
    assert reply.json()["field"] == "instances.3.node_count"


@pytest.mark.parametrize("body", [{"instances": []}, {"instances": instances(1), "model": "JPCP"}])
async def test_an_empty_stream_or_an_unknown_field_is_a_422(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    reply = await client.post("/v1/tasks/pavement.distress.jpcp/stream", json=body)
    assert reply.status_code == 422


async def test_an_unknown_task_is_a_404_before_anything_is_submitted(
    client: httpx.AsyncClient, pipeline: StreamingPipeline
) -> None:
    reply = await client.post("/v1/tasks/no.such.task/stream", json={"instances": instances(2)})
    assert (reply.status_code, reply.json()["code"]) == (404, "unknown_task")
    assert pipeline.submitted == 0


async def test_a_client_that_disconnects_mid_stream_stops_the_work_still_queued(
    app: Any, pipeline: StreamingPipeline, tracer: RecordingTracer
) -> None:
    total = 2000
    # Short embeddings keep the body under the limit; the fake does not check their length.
    body = json.dumps({"instances": [{"embedding": [0.1], "node_count": i + 1} for i in range(total)]}).encode()
    gone = asyncio.Event()
    sent: list[Message] = []

    async def receive() -> Message:
        if not sent:
            sent.append({"type": "request-read"})
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            gone.set()  # the first line is in: the client goes away

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/tasks/pavement.distress.jpcp/stream",
        "raw_path": b"/v1/tasks/pavement.distress.jpcp/stream",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("serving", 80),
        "client": ("test", 1),
        "root_path": "",
    }
    await app(scope, receive, send)
    assert sent[1]["status"] == 200
    for _ in range(CHUNK + 1):
        await asyncio.sleep(0)
    assert pipeline.done < total // 10
    assert pipeline.cancelled > 0
    assert pipeline.submitted == pipeline.done + pipeline.cancelled  # nothing left pending
    [(_, code)] = tracer.finished
    assert code == "client_disconnected"


async def test_the_openapi_document_shows_both_stream_routes_with_their_bodies(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    for path in ("/v1/tasks/{task}/stream", "/v1/models/{model}/stream"):
        route = spec["paths"][path]["post"]
        assert "instances" in route["requestBody"]["content"]["application/json"]["schema"]["properties"]
        assert "application/x-ndjson" in route["responses"]["200"]["content"]
        assert "503" in route["responses"]
