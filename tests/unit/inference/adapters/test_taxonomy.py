"""Every remote adapter maps the same wire failures to the same kinds of the taxonomy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from examlops.inference.adapters.examlops import ExamlopsAdapter, ExamlopsTarget
from examlops.inference.adapters.kserve_v2 import KserveV2Adapter, V2Target
from examlops.inference.adapters.mlflow import MlflowAdapter, MlflowTarget
from examlops.inference.errors import FeatureUnsupported, InferenceError, Kind
from examlops.inference.ports import Adapter, Call
from tests.unit.inference.adapters.fakes import Handler, Network, refuse, reply

ROW = {"embedding": [0.1, 0.2], "node_count": 3}

Build = Callable[[httpx.AsyncBaseTransport], Adapter]
BUILDERS: dict[str, Build] = {
    "examlops": lambda t: ExamlopsAdapter(
        "http://s", {"r": ExamlopsTarget(task="t")}, token="k", max_batch=4, transport=t
    ),
    "kserve_v2": lambda t: KserveV2Adapter("http://s", {"r": V2Target(model="m")}, max_batch=4, transport=t),
    "mlflow": lambda t: MlflowAdapter("http://s", {"r": MlflowTarget()}, max_batch=4, transport=t),
}


@pytest.fixture(params=sorted(BUILDERS))
def build(request: pytest.FixtureRequest) -> Build:
    return BUILDERS[request.param]


async def call_with(build: Build, handler: Handler, call: Call | None = None) -> tuple[InferenceError, Network]:
    network = Network(handler)
    adapter = build(network.transport)
    await adapter.start()
    try:
        with pytest.raises(InferenceError) as caught:
            await adapter.predict_batch("r", [ROW], call or Call(route="r"))
    finally:
        await adapter.close()
    return caught.value, network


@pytest.mark.parametrize(
    ("status", "body", "headers", "kind"),
    [
        (422, {"error": "embedding: too short", "code": "invalid_input"}, None, Kind.VALIDATION),
        (400, {"error": "bad tensor"}, None, Kind.VALIDATION),
        (401, {"error": "no token", "code": "unauthenticated"}, None, Kind.PRECONDITION),
        (403, {"error": "no call", "code": "forbidden"}, None, Kind.PRECONDITION),
        (404, {"error": "unknown", "code": "unknown_task"}, None, Kind.PRECONDITION),
        (415, None, None, Kind.PRECONDITION),
        (429, None, {"Retry-After": "3"}, Kind.THROTTLED),
        (503, {"error": "refused", "code": "refused"}, {"Retry-After": "2"}, Kind.THROTTLED),
        (503, {"error": "loading", "code": "not_ready"}, None, Kind.INFRASTRUCTURE),
        (502, None, None, Kind.INFRASTRUCTURE),
        (504, {"error": "late", "code": "deadline_exceeded"}, None, Kind.TIMEOUT),
        (
            500,
            {"error": "model raised", "code": "inference_failed", "inference_failed": True},
            None,
            Kind.MODEL_FAILURE,
        ),
        (500, {"error": "internal error", "code": "internal_error"}, None, Kind.INFRASTRUCTURE),
    ],
)
async def test_an_error_status_is_mapped_to_its_kind_with_the_bodys_code(
    build: Build, status: int, body: Any, headers: dict[str, str] | None, kind: Kind
) -> None:
    error, _ = await call_with(build, reply(status, body, headers))
    assert error.kind is kind
    if isinstance(body, dict) and "code" in body:
        assert error.code == body["code"]
    assert error.retryable is (kind in (Kind.THROTTLED, Kind.INFRASTRUCTURE))
    if kind is Kind.THROTTLED:
        assert headers is not None and error.retry_after_s == float(headers["Retry-After"])


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (httpx.ConnectError, Kind.INFRASTRUCTURE),
        (httpx.ReadError, Kind.INFRASTRUCTURE),
        (httpx.RemoteProtocolError, Kind.INFRASTRUCTURE),
        (httpx.ConnectTimeout, Kind.TIMEOUT),
        (httpx.ReadTimeout, Kind.TIMEOUT),
    ],
)
async def test_a_transport_error_is_mapped_and_chained(
    build: Build, exc: type[httpx.TransportError], kind: Kind
) -> None:
    error, _ = await call_with(build, refuse(exc))
    assert error.kind is kind
    assert isinstance(error.__cause__, exc)


async def test_a_backend_slower_than_the_deadline_is_a_timeout(build: Build) -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)
        return httpx.Response(200)

    error, network = await call_with(build, slow, Call(route="r", deadline=time.monotonic() + 0.05))
    assert error.kind is Kind.TIMEOUT
    assert len(network.requests) == 1


async def test_a_deadline_already_passed_is_a_timeout_before_any_io(build: Build) -> None:
    error, network = await call_with(build, reply(200, {}), Call(route="r", deadline=time.monotonic() - 1))
    assert error.kind is Kind.TIMEOUT
    assert network.requests == []


async def test_an_unwired_route_is_a_precondition_before_any_io(build: Build) -> None:
    network = Network(reply(200, {}))
    adapter = build(network.transport)
    await adapter.start()
    with pytest.raises(InferenceError) as caught:
        await adapter.predict_batch("other", [ROW], Call(route="other"))
    await adapter.close()
    assert (caught.value.kind, caught.value.code) == (Kind.PRECONDITION, "inference_route_unknown")
    assert network.requests == []


async def test_a_call_before_start_or_after_close_is_a_precondition(build: Build) -> None:
    network = Network(reply(200, {}))
    adapter = build(network.transport)
    with pytest.raises(InferenceError) as caught:
        await adapter.predict_batch("r", [ROW], Call(route="r"))
    assert caught.value.code == "inference_adapter_not_started"
    await adapter.start()
    await adapter.start()  # idempotent
    await adapter.close()
    await adapter.close()
    with pytest.raises(InferenceError):
        await adapter.predict_batch("r", [ROW], Call(route="r"))
    assert network.requests == []


async def test_every_remote_adapter_declares_itself_non_deterministic(build: Build) -> None:
    adapter = build(httpx.MockTransport(reply(200, {})))
    assert isinstance(adapter, Adapter)
    assert adapter.capabilities.deterministic is False
    assert adapter.capabilities.native_batching is True


async def test_a_batch_over_the_declared_cap_is_refused_as_unsupported_before_any_io(build: Build) -> None:
    network = Network(reply(200, {}))
    adapter = build(network.transport)
    await adapter.start()
    with pytest.raises(FeatureUnsupported) as caught:
        await adapter.predict_batch("r", [ROW] * 5, Call(route="r"))
    await adapter.close()
    assert (caught.value.kind, caught.value.code) == (Kind.PRECONDITION, "inference_feature_unsupported")
    assert caught.value.backend == adapter.backend
    assert network.requests == []
