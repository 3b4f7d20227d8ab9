"""Bearer tokens on the HTTP routes, against the fake pipeline and an in-memory identity store."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client import CollectorRegistry

from examlops.api.app import create_app
from examlops.core.settings import Settings
from examlops.identity import IdentityResolver, IdentityService, Role
from examlops.registry.catalog import load_catalog
from tests.unit.api.test_ingress import FakePipeline, body
from tests.unit.identity.fakes import InMemoryIdentityStore


@pytest.fixture
def pipeline(settings: Settings) -> FakePipeline:
    return FakePipeline(load_catalog(settings.catalog_path))


@pytest.fixture
def service() -> IdentityService:
    return IdentityService(InMemoryIdentityStore())


@pytest.fixture
async def client(
    settings: Settings, pipeline: FakePipeline, service: IdentityService
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, pipeline, CollectorRegistry(), identities=IdentityResolver(service.store, 30.0))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serving") as c:
        yield c


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_no_token_is_a_401_with_the_bearer_challenge_and_nothing_served(
    client: httpx.AsyncClient, pipeline: FakePipeline
) -> None:
    reply = await client.post("/infer-pipeline/infer", json=body())
    assert reply.status_code == 401
    assert reply.headers["www-authenticate"] == "Bearer"
    assert reply.json()["code"] == "unauthenticated" and reply.json()["inference_failed"] is False
    assert pipeline.seen == []


async def test_a_caller_may_call_its_model_but_not_another_nor_set_traffic(
    client: httpx.AsyncClient, pipeline: FakePipeline, service: IdentityService
) -> None:
    _, issued = service.add("robot-7", Role.CALLER, models=["JPCP"])
    ok = await client.post("/v1/models/jpcp/predict", json={"embedding": [0.1] * 384, "node_count": 3},
                           headers=bearer(issued.token))  # fmt: skip
    assert ok.status_code == 200, ok.text
    other = await client.post("/infer-pipeline/infer", json=body(model="AC"), headers=bearer(issued.token))
    assert other.status_code == 403
    assert other.json()["code"] == "forbidden" and other.json()["permission"] == "call"
    traffic = await client.put("/v1/traffic/JPCP", json={"Production": 100}, headers=bearer(issued.token))
    assert traffic.status_code == 403 and traffic.json()["permission"] == "set_traffic"
    reload = await client.post("/admin/reload", json={}, headers=bearer(issued.token))
    assert reload.status_code == 403 and reload.json()["permission"] == "reload"
    assert [r.model for r in pipeline.seen] == ["jpcp"]
    assert pipeline.traffic_set == [] and pipeline.reloads == []
    assert issued.token not in other.text + traffic.text + reload.text


async def test_an_operators_control_actions_name_it_as_the_actor(
    client: httpx.AsyncClient, pipeline: FakePipeline, service: IdentityService
) -> None:
    _, issued = service.add("console", Role.OPERATOR)
    assert (await client.put("/v1/traffic/JPCP", json={"Production": 100}, headers=bearer(issued.token))).is_success
    assert (await client.post("/admin/reload", json={"model": "jpcp"}, headers=bearer(issued.token))).is_success
    assert pipeline.traffic_set == [("JPCP", "console")]
    assert pipeline.reloads == [("JPCP", "console")]


async def test_health_readiness_and_metrics_need_no_token(client: httpx.AsyncClient) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (await client.get(path)).status_code == 200


async def test_the_openapi_document_shows_the_bearer_scheme_on_guarded_routes_only(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    ((name, scheme),) = spec["components"]["securitySchemes"].items()
    assert scheme["type"] == "http" and scheme["scheme"] == "bearer"
    assert spec["paths"]["/infer-pipeline/infer"]["post"]["security"] == [{name: []}]
    assert "security" not in spec["paths"]["/healthz"]["get"]


async def test_a_401_comes_before_a_bad_body_is_looked_at(client: httpx.AsyncClient) -> None:
    reply = await client.put("/v1/traffic/JPCP", json={"Production": "x"}, headers=bearer("exa_nope"))
    assert reply.status_code == 401
