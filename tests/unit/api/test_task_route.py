"""`POST /v1/tasks/{task}/infer` against a fake pipeline and an in-memory task map."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from examlops.api.app import create_app
from examlops.core.errors import InferenceFailed
from examlops.core.settings import Settings
from examlops.registry.catalog import load_catalog
from examlops.tasks.resolver import TaskResolver
from tests.unit.api.test_ingress import FakePipeline
from tests.unit.tasks.fakes import InMemoryTaskMap


@pytest.fixture
def pipeline(settings: Settings) -> FakePipeline:
    return FakePipeline(load_catalog(settings.catalog_path))


@pytest.fixture
def tasks() -> InMemoryTaskMap:
    tasks = InMemoryTaskMap()
    tasks.map("pavement.distress.jpcp", "JPCP", "Production")
    tasks.map("pavement.canary", "CRCP", "Canary")
    return tasks


@pytest.fixture
async def client(
    settings: Settings, pipeline: FakePipeline, tasks: InMemoryTaskMap
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, pipeline, CollectorRegistry(), identities=None, tasks=TaskResolver(tasks, ttl_s=0.0))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serving") as c:
        yield c


def body(**overrides: Any) -> dict[str, Any]:
    return {"embedding": [0.1] * 384, "node_count": 12, **overrides}


async def test_a_task_call_goes_to_the_mapped_model_and_alias_and_the_reply_names_all_four(
    client: httpx.AsyncClient, pipeline: FakePipeline
) -> None:
    reply = await client.post("/v1/tasks/pavement.canary/infer", json=body(job_id="j-1"))
    assert reply.status_code == 200, reply.text
    assert reply.json() == {
        "task": "pavement.canary",
        "model": "CRCP",
        "alias": "Canary",
        "version": "1",
        "run_id": "run-1",
        "prediction": 0.5,
        "error": None,
        "job_id": "j-1",
        "budget_ms": None,
        "budget_remaining_ms": None,
    }
    [seen] = pipeline.seen
    assert (seen.model, seen.alias, seen.version, seen.metadata) == (
        "CRCP",
        "Canary",
        None,
        {"task": "pavement.canary"},
    )


async def test_a_remap_applies_to_the_next_call_without_a_restart(
    client: httpx.AsyncClient, tasks: InMemoryTaskMap
) -> None:
    assert (await client.post("/v1/tasks/pavement.distress.jpcp/infer", json=body())).json()["model"] == "JPCP"
    tasks.map("pavement.distress.jpcp", "AC", "Production")
    assert (await client.post("/v1/tasks/pavement.distress.jpcp/infer", json=body())).json()["model"] == "AC"


async def test_an_unknown_task_is_a_404_unknown_task_naming_it(client: httpx.AsyncClient) -> None:
    reply = await client.post("/v1/tasks/pavement.distress.zz/infer", json=body())
    assert reply.status_code == 404
    data = reply.json()
    assert (data["code"], data["prediction"], data["model"]) == ("unknown_task", 0.0, None)
    assert "pavement.distress.zz" in data["error"]


async def test_a_long_unknown_task_is_named_by_a_short_prefix_only(client: httpx.AsyncClient) -> None:
    reply = await client.post(f"/v1/tasks/{'t' * 4000}/infer", json=body())
    assert reply.status_code == 404
    assert reply.json()["code"] == "unknown_task"
    assert "t" * 100 not in reply.text and len(reply.content) < 400


@pytest.mark.parametrize("field", ["model", "alias", "version"])
async def test_a_task_call_may_not_name_a_model_alias_or_version(client: httpx.AsyncClient, field: str) -> None:
    value: Any = 1 if field == "version" else "JPCP"
    reply = await client.post("/v1/tasks/pavement.distress.jpcp/infer", json=body(**{field: value}))
    assert reply.status_code == 422
    assert (reply.json()["code"], reply.json()["field"]) == ("invalid_input", field)


async def test_a_bad_payload_is_a_422_naming_the_field(client: httpx.AsyncClient) -> None:
    reply = await client.post(
        "/v1/tasks/pavement.distress.jpcp/infer",
        content=b'{"embedding":[NaN],"node_count":1}',
        headers={"content-type": "application/json"},
    )
    assert reply.status_code == 422
    assert reply.json()["field"] == "embedding.0"


@pytest.mark.parametrize("extra", [{"node_count": 2**70}, {"node_count": 0}])
async def test_a_node_count_past_any_catalog_is_a_422(client: httpx.AsyncClient, extra: dict[str, Any]) -> None:
    reply = await client.post("/v1/tasks/pavement.distress.jpcp/infer", json=body(**extra))
    assert reply.status_code == 422
    assert reply.json()["field"] == "node_count"


async def test_a_body_that_is_not_json_is_a_415(client: httpx.AsyncClient) -> None:
    reply = await client.post(
        "/v1/tasks/pavement.distress.jpcp/infer", content=b"{}", headers={"content-type": "text/plain"}
    )
    assert reply.status_code == 415
    assert reply.json()["code"] == "unsupported_media_type"


async def test_a_model_failure_names_the_model_that_failed(client: httpx.AsyncClient, pipeline: FakePipeline) -> None:
    pipeline.fail_with = InferenceFailed("the model raised")
    reply = await client.post("/v1/tasks/pavement.distress.jpcp/infer", json=body(job_id="j-2"))
    assert reply.status_code == 500
    data = reply.json()
    assert (data["inference_failed"], data["model"], data["job_id"]) == (True, "JPCP", "j-2")


async def test_not_ready_is_a_503_before_the_task_is_looked_up(
    client: httpx.AsyncClient, pipeline: FakePipeline, tasks: InMemoryTaskMap
) -> None:
    pipeline.ready = False
    reply = await client.post("/v1/tasks/pavement.distress.jpcp/infer", json=body())
    assert reply.status_code == 503
    assert tasks.reads == 0


async def test_the_model_routes_replies_carry_no_task_field(client: httpx.AsyncClient) -> None:
    reply = await client.post("/v1/models/JPCP/predict", json=body())
    assert reply.status_code == 200
    assert "task" not in reply.json()


async def test_the_openapi_document_shows_the_task_route_and_its_body(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    route = spec["paths"]["/v1/tasks/{task}/infer"]["post"]
    schema = route["requestBody"]["content"]["application/json"]["schema"]
    assert "model" not in schema["properties"] and "embedding" in schema["properties"]
    assert "404" in route["responses"]
    assert [(p["name"], p["in"], p["required"]) for p in route["parameters"]] == [("task", "path", True)]


async def test_the_model_routes_document_their_path_parameter_and_body(client: httpx.AsyncClient) -> None:
    paths = (await client.get("/openapi.json")).json()["paths"]
    predict, infer = paths["/v1/models/{model}/predict"]["post"], paths["/infer-pipeline/infer"]["post"]
    assert [(p["name"], p["in"], p["required"]) for p in predict["parameters"]] == [("model", "path", True)]
    assert not [p for p in infer.get("parameters", []) if p["in"] == "path"]
    for route in (predict, infer):
        assert "embedding" in route["requestBody"]["content"]["application/json"]["schema"]["properties"]
