"""The HTTP ingress against a fake pipeline: every refusal is a 422 or 413 that names the field."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from examlops.api.app import create_app
from examlops.api.schemas import ErrorReply
from examlops.core.collector import LoadGovernor
from examlops.core.errors import InferenceFailed, InferenceTimeout, ModelNotFound
from examlops.core.messages import KNOWN_ALIASES, InferenceRequest, InferenceResult
from examlops.core.settings import Settings
from examlops.registry.catalog import Catalog, load_catalog
from examlops.serving.router import validate_split
from examlops.tracing import Tracer

ERROR_KEYS = set(ErrorReply.model_fields)
"""Every error body has every field of ``ErrorReply``, set or null."""


@dataclass
class FakePipeline:
    catalog: Catalog
    ready: bool = True
    seen: list[InferenceRequest] = field(default_factory=list)
    fail_with: Exception | None = None
    traffic_set: list[tuple[str, str]] = field(default_factory=list)
    reloads: list[tuple[str | None, str]] = field(default_factory=list)
    admitted: list[tuple[InferenceRequest, int]] = field(default_factory=list)
    refuse_admission: Exception | None = None

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def infer(self, request: InferenceRequest) -> InferenceResult:
        self.seen.append(request)
        if self.fail_with is not None:
            raise self.fail_with
        spec = self.catalog.get(request.model)
        return InferenceResult(spec.name, request.alias or "Production", "1", "run-1", 0.5, request.job_id)

    def admit(self, request: InferenceRequest, rows: int = 1) -> float | None:
        self.admitted.append((request, rows))
        if self.refuse_admission is not None:
            raise self.refuse_admission
        return None

    async def route(self, model: str, alias: str | None = None) -> str:
        return alias or self.catalog.get(model).default_alias_canonical

    def hot_set(self) -> Sequence[Any]:
        return []

    def traffic(self, model: str) -> dict[str, int]:
        return {}

    def check_traffic(self, model: str, weights: Mapping[str, int]) -> dict[str, int]:
        self.catalog.get(model)
        return validate_split(weights, KNOWN_ALIASES)

    def set_traffic(self, model: str, weights: Mapping[str, int], actor: str = "") -> dict[str, int]:
        self.traffic_set.append((model, actor))
        return dict(weights)

    async def reload(self, model: str | None = None, *, actor: str = "") -> Sequence[Any]:
        self.reloads.append((model, actor))
        return []


@pytest.fixture
def pipeline(settings: Settings) -> FakePipeline:
    return FakePipeline(load_catalog(settings.catalog_path))


@pytest.fixture
async def client(settings: Settings, pipeline: FakePipeline) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, pipeline, CollectorRegistry(), identities=None)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://serving") as c:
        yield c


def body(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": "JPCP", "embedding": [0.1] * 384, "node_count": 12}
    base.update(overrides)
    return base


async def test_a_valid_request_is_answered_with_the_model_version_and_job_id(client: httpx.AsyncClient) -> None:
    reply = await client.post("/infer-pipeline/infer", json=body(job_id="j-1"))
    assert reply.status_code == 200
    assert reply.json() == {
        "model": "JPCP",
        "alias": "Production",
        "version": "1",
        "run_id": "run-1",
        "prediction": 0.5,
        "error": None,
        "job_id": "j-1",
        "budget_ms": None,
        "budget_remaining_ms": None,
    }


RAW_REFUSALS = [
    ("embedding.0", '{"model":"JPCP","embedding":[NaN],"node_count":1}'),
    ("embedding.0", '{"model":"JPCP","embedding":[Infinity],"node_count":1}'),
    ("embedding.1", '{"model":"JPCP","embedding":[1, 1e309],"node_count":1}'),
    ("embedding.0", '{"model":"JPCP","embedding":["1.0"],"node_count":1}'),
    ("embedding.0", '{"model":"JPCP","embedding":[true],"node_count":1}'),
    ("embedding.0", '{"model":"JPCP","embedding":[null],"node_count":1}'),
    ("embedding.0", '{"model":"JPCP","embedding":[[1.0]],"node_count":1}'),
    ("embedding", '{"model":"JPCP","embedding":"abc","node_count":1}'),
    ("embedding", '{"model":"JPCP","node_count":1}'),
    ("node_count", '{"model":"JPCP","embedding":[1.0]}'),
    ("node_count", '{"model":"JPCP","embedding":[1.0],"node_count":0}'),
    ("node_count", '{"model":"JPCP","embedding":[1.0],"node_count":2.5}'),
    ("node_count", '{"model":"JPCP","embedding":[1.0],"node_count":true}'),
    ("node_count", '{"model":"JPCP","embedding":[1.0],"node_count":"3"}'),
    ("surprise", '{"model":"JPCP","embedding":[1.0],"node_count":1,"surprise":1}'),
    ("body", '{"model": "JPCP", "embedding": [1.0'),
]


@pytest.mark.parametrize(("field", "raw"), RAW_REFUSALS)
async def test_bad_payloads_get_a_422_naming_the_field(
    client: httpx.AsyncClient, pipeline: FakePipeline, field: str, raw: str
) -> None:
    reply = await client.post("/infer-pipeline/infer", content=raw, headers={"content-type": "application/json"})
    assert reply.status_code == 422, reply.text
    data = reply.json()
    assert data["prediction"] == 0.0
    assert data["inference_failed"] is False
    assert data["field"].startswith(field) or field == "body"
    assert pipeline.seen == []


async def test_a_refusal_never_echoes_the_input(client: httpx.AsyncClient) -> None:
    secret = "x" * 5000
    reply = await client.post("/infer-pipeline/infer", json=body(embedding=[secret]))
    assert reply.status_code == 422
    assert "xxxxxxxxxx" not in reply.text
    assert len(reply.content) < 1000


async def test_alias_and_version_together_are_refused(client: httpx.AsyncClient) -> None:
    reply = await client.post("/infer-pipeline/infer", json=body(alias="Canary", version=2))
    assert reply.status_code == 422
    assert reply.json()["field"] == "version"


async def test_a_declared_oversized_body_gets_413_before_it_is_read(client: httpx.AsyncClient) -> None:
    big = json.dumps(body(embedding=[0.123456789] * 120_000)).encode()
    assert len(big) > 1024 * 1024
    reply = await client.post("/infer-pipeline/infer", content=big, headers={"content-type": "application/json"})
    assert reply.status_code == 413
    assert reply.json()["code"] == "payload_too_large"


async def test_a_chunked_oversized_body_gets_413(client: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(40):
            yield b" " * 65536

    reply = await client.post("/infer-pipeline/infer", content=chunks(), headers={"content-type": "application/json"})
    assert reply.status_code == 413


@pytest.mark.parametrize(
    ("error", "status", "failed"),
    [
        (ModelNotFound("no such model"), 404, False),
        (InferenceFailed("model raised"), 500, True),
        (InferenceTimeout("past 30 s"), 504, True),
    ],
)
async def test_pipeline_errors_map_to_statuses_with_a_zero_prediction(
    client: httpx.AsyncClient, pipeline: FakePipeline, error: Exception, status: int, failed: bool
) -> None:
    pipeline.fail_with = error
    reply = await client.post("/infer-pipeline/infer", json=body(job_id="j-9"))
    assert reply.status_code == status
    data = reply.json()
    assert data["prediction"] == 0.0
    assert data["inference_failed"] is failed
    assert data["job_id"] == "j-9"
    assert data["error"]


async def test_not_ready_is_503(client: httpx.AsyncClient, pipeline: FakePipeline) -> None:
    pipeline.ready = False
    reply = await client.post("/v1/models/JPCP/predict", json={"embedding": [0.1] * 384, "node_count": 1})
    assert reply.status_code == 503
    assert (await client.get("/readyz")).status_code == 503
    assert (await client.get("/healthz")).status_code == 200


async def test_direct_predict_uses_the_path_model(client: httpx.AsyncClient, pipeline: FakePipeline) -> None:
    reply = await client.post(
        "/v1/models/jpcp/predict", json={"embedding": [0.1] * 384, "node_count": 3, "alias": "canary"}
    )
    assert reply.status_code == 200
    assert pipeline.seen[0].model == "jpcp"
    assert pipeline.seen[0].alias == "canary"


def assert_error_body(data: dict[str, Any], code: str) -> None:
    """The one error body: the same keys for our errors and the framework's own."""
    assert set(data) == ERROR_KEYS
    assert (data["prediction"], data["code"], data["inference_failed"]) == (0.0, code, False)
    assert data["error"]


async def test_a_method_the_route_does_not_take_is_a_405_with_our_body_and_its_allow_header(
    client: httpx.AsyncClient,
) -> None:
    reply = await client.get("/infer-pipeline/infer")
    assert reply.status_code == 405
    assert reply.headers["allow"] == "POST"
    assert_error_body(reply.json(), "method_not_allowed")


async def test_an_unknown_route_is_a_404_with_our_body_echoing_only_a_prefix_of_the_path(
    client: httpx.AsyncClient,
) -> None:
    reply = await client.post("/v9/" + "p" * 5000, json=body())
    assert reply.status_code == 404
    assert_error_body(reply.json(), "not_found")
    assert "p" * 100 not in reply.text
    assert len(reply.content) < 400


async def test_a_route_level_http_exception_gets_our_body_and_keeps_its_headers(
    settings: Settings, pipeline: FakePipeline
) -> None:
    from fastapi import HTTPException

    app = create_app(settings, pipeline, CollectorRegistry(), identities=None)

    async def teapot() -> None:
        raise HTTPException(status_code=418, detail="t" * 5000, headers={"Retry-After": "7"})

    app.add_api_route("/teapot", teapot)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serving") as c:
        reply = await c.get("/teapot")
    assert reply.status_code == 418
    assert reply.headers["retry-after"] == "7"
    assert_error_body(reply.json(), "i_m_a_teapot")
    assert len(reply.content) < 500  # a 256-character message and every field of ErrorReply


async def test_a_bad_body_on_a_route_fastapi_parses_is_a_422_with_our_body(client: httpx.AsyncClient) -> None:
    reply = await client.put("/v1/traffic/JPCP", json={"Production": "x" * 5000})
    assert reply.status_code == 422
    assert_error_body(reply.json(), "invalid_input")
    assert "x" * 100 not in reply.text


@pytest.mark.parametrize(
    ("field", "extra"),
    [
        ("version", {"version": 9223372036854775808}),
        ("version", {"version": 2**31}),
        ("node_count", {"node_count": 2**70}),
    ],
)
async def test_numbers_past_what_the_registry_and_features_hold_are_a_422(
    client: httpx.AsyncClient, pipeline: FakePipeline, field: str, extra: dict[str, Any]
) -> None:
    reply = await client.post("/infer-pipeline/infer", json=body(**extra))
    assert reply.status_code == 422
    assert_error_body(reply.json(), "invalid_input")
    assert reply.json()["field"] == field
    assert pipeline.seen == []


@pytest.mark.parametrize("content_type", ["text/plain", "application/xml", "multipart/form-data; boundary=b"])
async def test_a_body_that_is_not_json_is_a_415_before_the_pipeline(
    client: httpx.AsyncClient, pipeline: FakePipeline, content_type: str
) -> None:
    reply = await client.post(
        "/infer-pipeline/infer", content=json.dumps(body()), headers={"content-type": content_type}
    )
    assert reply.status_code == 415
    assert_error_body({**reply.json(), "field": None}, "unsupported_media_type")
    assert reply.headers["connection"] == "close"
    assert pipeline.seen == []


async def test_a_reload_without_a_body_needs_no_content_type(client: httpx.AsyncClient) -> None:
    assert (await client.post("/admin/reload")).status_code == 200


async def test_a_long_model_name_is_echoed_as_a_short_prefix_only(
    client: httpx.AsyncClient, pipeline: FakePipeline
) -> None:
    pipeline.fail_with = ModelNotFound("m" * 4000)  # even a message built from the caller's string
    reply = await client.post("/v1/models/" + "m" * 4000 + "/predict", json={"embedding": [0.1] * 384, "node_count": 1})
    assert reply.status_code == 404
    assert "m" * 300 not in reply.text
    assert reply.json()["model"] == "m" * 64 + "…"
    assert len(reply.content) < 600


async def test_metrics_show_the_collectors_pauses_while_the_app_runs_and_it_stops_timing_them_after(
    settings: Settings, pipeline: FakePipeline
) -> None:
    registry = CollectorRegistry()
    app = create_app(settings, pipeline, registry, identities=None)
    thresholds = gc.get_threshold()
    try:
        async with app.router.lifespan_context(app):
            gc.collect(2)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://serving") as c:
                text = (await c.get("/metrics")).text
            shown = {
                sample.labels["generation"]: sample.value
                for family in text_string_to_metric_families(text)
                if family.name == "examlops_gc_pause_seconds"
                for sample in family.samples
                if sample.name == "examlops_gc_pause_seconds_count"
            }
            assert shown.get("2", 0) >= 1, shown  # timed while the app runs, not only declared
        counted = registry.get_sample_value("examlops_gc_pause_seconds_count", {"generation": "2"})
        assert counted is not None and counted >= 1
        gc.collect(2)
        assert registry.get_sample_value("examlops_gc_pause_seconds_count", {"generation": "2"}) == counted
    finally:
        gc.unfreeze()  # the lifespan froze the test process's objects (core.collector.quiet_collector)
        gc.set_threshold(*thresholds)


class FailingTracer(Tracer):
    def start(self) -> None:
        raise RuntimeError("the trace writer cannot start")


async def test_an_app_whose_start_up_fails_leaves_no_hook_on_the_garbage_collector(
    settings: Settings, pipeline: FakePipeline
) -> None:
    before = list(gc.callbacks)
    app = create_app(settings, pipeline, CollectorRegistry(), identities=None, tracer=FailingTracer(None))
    with pytest.raises(RuntimeError, match="cannot start"):
        async with app.router.lifespan_context(app):
            pass
    assert gc.callbacks == before


async def test_the_collectors_governor_runs_while_the_app_lives_and_leaves_collection_on_after(
    settings: Settings, pipeline: FakePipeline
) -> None:
    registry = CollectorRegistry()
    in_flight = {"calls": 500}
    governor = LoadGovernor(lambda: in_flight["calls"], registry, pause_at=100, poll_s=0.005)
    app = create_app(settings, pipeline, registry, identities=None, collector=governor)
    thresholds = gc.get_threshold()
    try:
        async with app.router.lifespan_context(app):
            for _ in range(400):
                if governor.holding:
                    break
                await asyncio.sleep(0.005)
            assert governor.holding and not gc.isenabled()
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://serving") as c:
                text = (await c.get("/metrics")).text
            assert "examlops_gc_deferred 1.0" in text
        assert gc.isenabled() and not governor.holding
        assert registry.get_sample_value("examlops_gc_deferred") == 0.0
    finally:
        gc.enable()
        gc.unfreeze()  # the lifespan froze the test process's objects (core.collector.quiet_collector)
        gc.set_threshold(*thresholds)


@dataclass
class SlowStartPipeline(FakePipeline):
    """Start-up that ends only when ``loaded`` is set (a hot set still loading at shutdown)."""

    loaded: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        await self.loaded.wait()
        await super().start()


class LoadingEndsDuringClose:
    """A job runner whose close lets the pipeline's start-up end meanwhile."""

    def __init__(self, pipeline: SlowStartPipeline) -> None:
        self.pipeline = pipeline

    def start(self) -> None:
        pass

    async def close(self) -> None:
        self.pipeline.loaded.set()
        await asyncio.sleep(0.05)


async def test_a_start_up_still_running_at_shutdown_never_starts_the_governor(
    settings: Settings, pipeline: FakePipeline
) -> None:
    slow = SlowStartPipeline(pipeline.catalog)
    registry = CollectorRegistry()
    governor = LoadGovernor(lambda: 500, registry, pause_at=100, poll_s=0.005)
    app = create_app(
        settings, slow, registry, identities=None, job_runner=LoadingEndsDuringClose(slow), collector=governor
    )
    thresholds = gc.get_threshold()
    try:
        async with app.router.lifespan_context(app):
            await asyncio.sleep(0.02)  # shut down while the hot set still loads
        await asyncio.sleep(0.05)
        assert governor._task is None, "the governor started after the app shut down"
        assert gc.isenabled() and not governor.holding
    finally:
        gc.enable()
        gc.unfreeze()
        gc.set_threshold(*thresholds)
