"""The V2 routes over a fake pipeline: rows become pipeline requests routed together, errors keep their meaning."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from examlops.api.app import create_app
from examlops.core.errors import InferenceFailed, InvalidInput
from examlops.core.messages import InferenceRequest, InferenceResult
from examlops.core.settings import Settings
from examlops.registry.catalog import load_catalog
from tests.unit.api.test_ingress import FakePipeline


class RowPipeline(FakePipeline):
    """Answers each row with its node count; fails the rows whose node count is in ``bad``."""

    bad: dict[int, Exception]

    async def route(self, model: str, alias: str | None = None) -> str:
        return alias or "Canary"  # as if the split drew Canary

    async def infer(self, request: InferenceRequest) -> InferenceResult:
        self.seen.append(request)
        if request.node_count in self.bad:
            raise self.bad[request.node_count]
        alias = "pinned" if request.version else request.alias or "Production"
        return InferenceResult("JPCP", alias, request.version or "2", "run-2", float(request.node_count))


@pytest.fixture
def pipeline(settings: Settings) -> RowPipeline:
    fake = RowPipeline(load_catalog(settings.catalog_path))
    fake.bad = {}
    return fake


@pytest.fixture
async def client(settings: Settings, pipeline: RowPipeline) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, pipeline, CollectorRegistry(), identities=None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serving") as c:
        yield c


def request(counts: list[int], **extra: Any) -> dict[str, Any]:
    return {
        "inputs": [
            {
                "name": "embedding",
                "datatype": "FP64",
                "shape": [len(counts), 384],
                "data": [[0.01] * 384] * len(counts),
            },
            {"name": "node_count", "datatype": "INT64", "shape": [len(counts)], "data": counts},
        ],
        **extra,
    }


async def test_rows_go_through_the_pipeline_routed_once_and_answered_together(
    client: httpx.AsyncClient, pipeline: RowPipeline
) -> None:
    reply = await client.post("/v2/models/jpcp/infer", json=request([3, 5, 7], id="abc"))
    assert reply.status_code == 200, reply.text
    assert reply.json() == {
        "model_name": "JPCP",
        "model_version": "2",
        "id": "abc",
        "parameters": {"alias": "Canary"},
        "outputs": [{"name": "prediction", "datatype": "FP64", "shape": [3], "data": [3.0, 5.0, 7.0]}],
    }
    assert [(r.model, r.alias, r.routed, r.version) for r in pipeline.seen] == [("JPCP", "Canary", True, None)] * 3


async def test_a_version_in_the_path_pins_every_row(client: httpx.AsyncClient, pipeline: RowPipeline) -> None:
    reply = await client.post("/v2/models/JPCP/versions/7/infer", json=request([1, 2]))
    assert reply.json()["model_version"] == "7" and reply.json()["parameters"] == {"alias": "pinned"}
    assert {(r.version, r.alias, r.routed) for r in pipeline.seen} == {("7", None, False)}


async def test_an_alias_parameter_with_a_version_is_refused(client: httpx.AsyncClient) -> None:
    reply = await client.post("/v2/models/JPCP/versions/7/infer", json=request([1], parameters={"alias": "Canary"}))
    assert reply.status_code == 422 and reply.json()["code"] == "invalid_input"


@pytest.mark.parametrize("version", ["abc", "0", "99999999999"])
async def test_a_path_version_that_is_not_one_is_a_404(client: httpx.AsyncClient, version: str) -> None:
    reply = await client.post(f"/v2/models/JPCP/versions/{version}/infer", json=request([1]))
    assert reply.status_code == 404 and "prediction" not in reply.text


async def test_a_model_failure_in_any_row_fails_the_call_marked_for_the_retrain_trigger(
    client: httpx.AsyncClient, pipeline: RowPipeline
) -> None:
    pipeline.bad = {2: InvalidInput("bad row", field="embedding"), 3: InferenceFailed("the model raised")}
    reply = await client.post("/v2/models/JPCP/infer", json=request([1, 2, 3]))
    assert reply.status_code == 500
    assert reply.json() == {"error": "the model raised", "code": "inference_failed", "inference_failed": True}


async def test_a_bad_row_fails_the_call_with_a_422(client: httpx.AsyncClient, pipeline: RowPipeline) -> None:
    pipeline.bad = {2: InvalidInput("expected 384 values", field="embedding")}
    reply = await client.post("/v2/models/JPCP/infer", json=request([1, 2]))
    assert reply.status_code == 422 and reply.json()["inference_failed"] is False


async def test_an_unknown_model_is_a_404_with_a_v2_error(client: httpx.AsyncClient) -> None:
    reply = await client.post("/v2/models/nope/infer", json=request([1]))
    assert reply.status_code == 404 and set(reply.json()) == {"error", "code", "inference_failed"}


async def test_binary_in_and_out_over_octet_stream(client: httpx.AsyncClient) -> None:
    embedding = np.full((2, 384), 0.01, dtype=np.float32)
    counts = np.array([4, 9], dtype=np.int32)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "embedding",
                    "datatype": "FP32",
                    "shape": [2, 384],
                    "parameters": {"binary_data_size": embedding.nbytes},
                },
                {"name": "node_count", "datatype": "INT32", "shape": [2], "parameters": {"binary_data_size": 8}},
            ],
            "outputs": [{"name": "prediction", "parameters": {"binary_data": True}}],
        }
    ).encode()
    reply = await client.post(
        "/v2/models/JPCP/infer",
        content=head + embedding.tobytes() + counts.tobytes(),
        headers={"content-type": "application/octet-stream", "inference-header-content-length": str(len(head))},
    )
    assert reply.status_code == 200, reply.text
    length = int(reply.headers["inference-header-content-length"])
    assert json.loads(reply.content[:length])["outputs"][0]["parameters"] == {"binary_data_size": 16}
    assert np.frombuffer(reply.content[length:], "<f8").tolist() == [4.0, 9.0]


async def test_octet_stream_is_refused_off_the_v2_infer_routes(client: httpx.AsyncClient) -> None:
    headers = {"content-type": "application/octet-stream"}
    assert (await client.post("/v1/models/JPCP/predict", content=b"{}", headers=headers)).status_code == 415
    assert (
        await client.post("/v2/models/JPCP/infer", content=b"{}", headers={"content-type": "text/plain"})
    ).status_code == 415


async def test_not_ready_is_400_on_health_and_503_on_infer(client: httpx.AsyncClient, pipeline: RowPipeline) -> None:
    pipeline.ready = False
    assert (await client.get("/v2/health/ready")).status_code == 400
    assert (await client.get("/v2/health/live")).status_code == 200
    reply = await client.post("/v2/models/JPCP/infer", json=request([1]))
    assert reply.status_code == 503 and reply.json()["code"] == "not_ready"


async def test_server_and_model_metadata(client: httpx.AsyncClient) -> None:
    server = (await client.get("/v2")).json()
    assert server["name"] == "examlops" and "binary_tensor_data" in server["extensions"]
    meta = (await client.get("/v2/models/jpcp")).json()
    assert meta["name"] == "JPCP" and meta["platform"] == "sklearn"
    assert meta["inputs"] == [
        {"name": "embedding", "datatype": "FP64", "shape": [-1, 384]},
        {"name": "node_count", "datatype": "INT64", "shape": [-1]},
    ]
    assert meta["outputs"] == [{"name": "prediction", "datatype": "FP64", "shape": [-1]}]


async def test_openapi_lists_the_v2_routes_with_their_error_bodies(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    for path in ("/v2", "/v2/health/ready", "/v2/models/{model}", "/v2/models/{model}/versions/{version}/infer"):
        assert path in spec["paths"]
    infer = spec["paths"]["/v2/models/{model}/versions/{version}/infer"]["post"]
    assert infer["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith("V2ErrorReply")
    assert "application/octet-stream" in infer["requestBody"]["content"]


async def test_a_v2_call_is_one_trace_naming_model_alias_version_and_id(
    settings: Settings, pipeline: RowPipeline
) -> None:
    from examlops.tracing import Tracer
    from tests.unit.api.test_tracing import Queue

    queue = Queue()
    app = create_app(settings, pipeline, CollectorRegistry(), identities=None, tracer=Tracer(queue, node="n1"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serving") as client:
        ok = await client.post("/v2/models/JPCP/infer", json=request([1, 2, 3], id="abc"))
        pipeline.bad = {5: InferenceFailed("the model raised")}
        failed = await client.post("/v2/models/JPCP/infer", json=request([5]))
    assert (ok.status_code, failed.status_code) == (200, 500)
    first, second = queue.records
    assert (first.outcome, first.model, first.alias, first.version, first.job_id) == (
        "answered",
        "JPCP",
        "Canary",
        "2",
        "abc",
    )
    assert {r.facts is not None for r in pipeline.seen} == {True}  # every row hands its facts to the trace
    assert (second.outcome, second.error_code) == ("failed", "inference_failed")


async def test_body_limit_and_media_type_refusals_on_v2_carry_the_v2_error_body(client: httpx.AsyncClient) -> None:
    big = await client.post("/v2/models/JPCP/infer", content=b"x" * (2 * 1024 * 1024), headers={"content-type": ""})
    plain = await client.post("/v2/models/JPCP/infer", content=b"{}", headers={"content-type": "text/plain"})
    for reply, status in ((big, 413), (plain, 415)):
        assert reply.status_code == status
        assert set(reply.json()) == {"error", "code", "inference_failed"}
    elsewhere = await client.post("/v1/models/JPCP/predict", content=b"{}", headers={"content-type": "text/plain"})
    assert elsewhere.json()["prediction"] == 0.0  # the model routes keep seed 000's error body


async def test_a_caller_may_infer_on_its_model_only_and_refusals_carry_the_v2_body(
    settings: Settings, pipeline: RowPipeline
) -> None:
    from examlops.identity import IdentityResolver, IdentityService, Role
    from tests.unit.identity.fakes import InMemoryIdentityStore

    service = IdentityService(InMemoryIdentityStore())
    _, issued = service.add("robot-7", Role.CALLER, models=["JPCP"])
    app = create_app(settings, pipeline, CollectorRegistry(), identities=IdentityResolver(service.store, 30.0))
    auth = {"Authorization": f"Bearer {issued.token}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serving") as c:
        assert (await c.get("/v2/health/ready")).status_code == 200  # probes carry no token
        assert (await c.get("/v2")).status_code == 200
        anonymous = await c.post("/v2/models/JPCP/infer", json=request([1]))
        assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == "Bearer"
        assert set(anonymous.json()) == {"error", "code", "inference_failed"}
        assert (await c.get("/v2/models/JPCP")).status_code == 401
        ok = await c.post("/v2/models/jpcp/infer", json=request([1, 2]), headers=auth)
        assert ok.status_code == 200, ok.text
        other = await c.post("/v2/models/AC/infer", json=request([1]), headers=auth)
        assert other.status_code == 403 and other.json()["code"] == "forbidden"
        assert set(other.json()) == {"error", "code", "inference_failed"}
        unknown_route = await c.get("/v2/nothing", headers=auth)
        assert unknown_route.status_code == 404 and "prediction" not in unknown_route.json()
    assert [r.model for r in pipeline.seen] == ["JPCP", "JPCP"]
