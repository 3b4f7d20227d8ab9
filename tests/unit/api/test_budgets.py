"""Budgets over HTTP: declared in the body or the header, the earlier end wins, the task's default applies,
answers say what remained, refusals are a 503 with the reason, the estimate and Retry-After."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from examlops.api.app import create_app
from examlops.api.errors import error_reply
from examlops.core.budget import BUDGET_HEADER
from examlops.core.errors import Refused
from examlops.core.messages import InferenceRequest, InferenceResult
from examlops.core.settings import Settings
from examlops.registry.catalog import load_catalog
from examlops.tasks.resolver import TaskResolver
from tests.unit.api.test_ingress import FakePipeline
from tests.unit.tasks.fakes import InMemoryTaskMap


@pytest.fixture
def pipeline(settings: Settings) -> FakePipeline:
    return FakePipeline(load_catalog(settings.catalog_path))


@pytest.fixture
async def client(settings: Settings, pipeline: FakePipeline) -> AsyncIterator[httpx.AsyncClient]:
    tasks = InMemoryTaskMap()
    route = tasks.map("pavement.distress.jpcp", "JPCP", "Production").route
    tasks.rows[route.task] = replace(route, budget_ms=250.0)
    app = create_app(settings, pipeline, CollectorRegistry(), identities=None, tasks=TaskResolver(tasks, ttl_s=0.0))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serving") as c:
        yield c


def body(**overrides: Any) -> dict[str, Any]:
    return {"embedding": [0.1] * 384, "node_count": 12, **overrides}


async def test_a_declared_budget_becomes_the_deadline_and_the_answer_says_what_remained(
    client: httpx.AsyncClient, pipeline: FakePipeline
) -> None:
    before = time.time()
    reply = await client.post("/v1/models/JPCP/predict", json=body(budget_ms=800))
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["budget_ms"] == 800
    assert 0 < data["budget_remaining_ms"] <= 800
    [seen] = pipeline.seen
    assert seen.budget_ms == 800
    assert seen.deadline is not None and before + 0.8 <= seen.deadline <= time.time() + 0.8


async def test_the_earlier_of_deadline_and_budget_wins(client: httpx.AsyncClient, pipeline: FakePipeline) -> None:
    soon = time.time() + 0.2
    await client.post("/v1/models/JPCP/predict", json=body(budget_ms=60_000, deadline=soon))
    await client.post("/v1/models/JPCP/predict", json=body(budget_ms=100, deadline=time.time() + 60))
    first, second = pipeline.seen
    assert first.deadline == soon
    assert second.deadline is not None and second.deadline < time.time() + 0.1


async def test_the_header_declares_a_budget_and_the_body_field_wins_over_it(
    client: httpx.AsyncClient, pipeline: FakePipeline
) -> None:
    await client.post("/v1/models/JPCP/predict", json=body(), headers={BUDGET_HEADER: "300"})
    await client.post("/v1/models/JPCP/predict", json=body(budget_ms=40), headers={BUDGET_HEADER: "300"})
    assert [seen.budget_ms for seen in pipeline.seen] == [300, 40]


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan", "1e12"])
async def test_a_bad_budget_header_is_a_422_naming_it_and_nothing_is_run(
    client: httpx.AsyncClient, pipeline: FakePipeline, value: str
) -> None:
    reply = await client.post("/v1/models/JPCP/predict", json=body(), headers={BUDGET_HEADER: value})
    assert reply.status_code == 422, reply.text
    assert reply.json()["field"] == BUDGET_HEADER
    assert pipeline.seen == []


@pytest.mark.parametrize("budget", [0, -1, 1e12])
async def test_a_bad_budget_field_is_a_422(client: httpx.AsyncClient, pipeline: FakePipeline, budget: float) -> None:
    reply = await client.post("/v1/models/JPCP/predict", json=body(budget_ms=budget))
    assert reply.status_code == 422
    assert reply.json()["field"] == "budget_ms"
    assert pipeline.seen == []


async def test_a_task_call_without_a_budget_gets_the_tasks_default(
    client: httpx.AsyncClient, pipeline: FakePipeline
) -> None:
    reply = await client.post("/v1/tasks/pavement.distress.jpcp/infer", json=body())
    assert reply.json()["budget_ms"] == 250
    reply = await client.post("/v1/tasks/pavement.distress.jpcp/infer", json=body(budget_ms=1000))
    assert reply.json()["budget_ms"] == 1000
    assert [(seen.budget_ms, seen.task) for seen in pipeline.seen] == [
        (250, "pavement.distress.jpcp"),
        (1000, "pavement.distress.jpcp"),
    ]


async def test_a_call_without_any_budget_has_none_and_no_deadline(
    client: httpx.AsyncClient, pipeline: FakePipeline
) -> None:
    data = (await client.post("/v1/models/JPCP/predict", json=body())).json()
    assert (data["budget_ms"], data["budget_remaining_ms"]) == (None, None)
    assert pipeline.seen[0].deadline is None


@pytest.mark.parametrize("path", ["/v1/models/JPCP/predict", "/v1/tasks/pavement.distress.jpcp/infer"])
async def test_an_early_refusal_is_a_503_with_the_reason_the_estimate_and_retry_after(
    client: httpx.AsyncClient, pipeline: FakePipeline, path: str
) -> None:
    pipeline.fail_with = Refused("no placement", reason="budget", estimate_ms=120.5, retry_after_s=2.2)
    reply = await client.post(path, json=body(budget_ms=50, job_id="j-9"))
    assert reply.status_code == 503
    data = reply.json()
    assert (data["code"], data["refused"], data["estimate_ms"], data["job_id"]) == ("refused", "budget", 120.5, "j-9")
    assert data["inference_failed"] is False
    assert reply.headers["retry-after"] == "3"


async def test_a_late_refusal_says_late(client: httpx.AsyncClient, pipeline: FakePipeline) -> None:
    pipeline.fail_with = Refused("ran out while queued", reason="late")
    reply = await client.post("/v1/models/JPCP/predict", json=body(budget_ms=50))
    assert reply.status_code == 503
    assert (reply.json()["refused"], reply.json()["estimate_ms"]) == ("late", None)


@dataclass
class NotingPipeline(FakePipeline):
    """Refuses every call as serving does: the refusal notes the call's budget and deadline."""

    reason: str = "budget"

    async def infer(self, request: InferenceRequest) -> InferenceResult:
        self.seen.append(request)
        raise Refused("no placement", reason=self.reason, estimate_ms=900.0).of_call(
            request.budget_ms, request.deadline
        )


@pytest.mark.parametrize("reason", ["budget", "late"])
@pytest.mark.parametrize("path", ["/v1/models/JPCP/predict", "/v1/tasks/pavement.distress.jpcp/infer"])
async def test_a_refusal_carries_the_calls_budget_and_what_remained_of_it_as_an_answer_does(
    settings: Settings, path: str, reason: str
) -> None:
    tasks = InMemoryTaskMap()
    tasks.map("pavement.distress.jpcp", "JPCP", "Production")
    pipeline = NotingPipeline(load_catalog(settings.catalog_path), reason=reason)
    app = create_app(settings, pipeline, CollectorRegistry(), identities=None, tasks=TaskResolver(tasks, ttl_s=0.0))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serving") as client:
        reply = await client.post(path, json=body(), headers={BUDGET_HEADER: "800"})
    assert reply.status_code == 503
    data = reply.json()
    assert (data["refused"], data["budget_ms"]) == (reason, 800)
    assert 0 < data["budget_remaining_ms"] <= 800


async def test_a_refusal_of_a_call_without_a_budget_says_it_had_none() -> None:
    data = error_reply(Refused("ran out while queued", reason="late")).model_dump()
    assert (data["refused"], data["budget_ms"], data["budget_remaining_ms"]) == ("late", None, None)


async def test_the_openapi_error_body_documents_the_budget_of_a_refusal(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    error = spec["components"]["schemas"]["ErrorReply"]["properties"]
    assert {"refused", "estimate_ms", "budget_ms", "budget_remaining_ms"} <= set(error)
    refusal = spec["paths"]["/v1/models/{model}/predict"]["post"]["responses"]["503"]["description"]
    assert "budget_ms and budget_remaining_ms" in refusal
