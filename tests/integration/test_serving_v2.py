"""The Open Inference Protocol against a real serving process, spoken by a client no one here wrote.

tritonclient's HTTP client checks liveness, readiness and metadata and infers in JSON and binary modes; its
predictions must be the model route's for the same rows. The protocol's own example requests and
malformed ones get a 4xx with a V2 error body, never a 5xx nor a prediction.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from examlops.core.settings import Settings
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from tests.integration.servers import ServingProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

AUDIT_DB = 13
"""A Redis database of serving's audit trail on the session's redis-server (tests flush database 0)."""
ROWS = 8
V2_ERROR_KEYS = {"error", "code", "inference_failed"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, redis_server: str) -> Iterator[ServingProcess]:
    home = tmp_path_factory.mktemp("serving-v2")
    settings = Settings(home=home)
    seed_demo(settings, load_catalog(settings.catalog_path))
    audit = f"{redis_server.rsplit('/', 1)[0]}/{AUDIT_DB}"  # a split needs its audit event
    proc = ServingProcess(home, env={"EXAMLOPS_PREDICT__WORKERS": "2", "EXAMLOPS_REDIS__URL": audit})
    try:
        proc.wait_ready()
        yield proc
    finally:
        code = proc.stop()
        assert code == 0, proc.log_tail()


def bearer_plugin(token: str) -> Any:
    """tritonclient's way to add a header to every request: a client plugin (its auth module has Basic only)."""
    from tritonclient._plugin import InferenceServerClientPlugin

    class Bearer(InferenceServerClientPlugin):
        def __call__(self, request: Any) -> None:
            request.headers["Authorization"] = f"Bearer {token}"

    return Bearer()


@pytest.fixture(scope="module")
def triton(server: ServingProcess) -> Iterator[Any]:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    client.register_plugin(bearer_plugin(server.token))
    yield client
    client.close()


def rows(seed: int = 0) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return rng.normal(0, 0.05, (ROWS, 384)), rng.integers(1, 200, ROWS)


def model_route(server: ServingProcess, embedding: np.ndarray[Any, Any], counts: np.ndarray[Any, Any]) -> list[float]:
    """The predictions of the model route, one call per row, pinned to the Production alias."""
    out = []
    for row, count in zip(embedding.tolist(), counts.tolist(), strict=True):
        reply = httpx.post(
            f"{server.url}/v1/models/JPCP/predict",
            json={"embedding": row, "node_count": count, "alias": "Production"},
            timeout=30,
            headers=server.auth,
        )
        assert reply.status_code == 200, reply.text
        out.append(reply.json()["prediction"])
    return out


def triton_inputs(embedding: np.ndarray[Any, Any], counts: np.ndarray[Any, Any], *, binary: bool) -> list[Any]:
    import tritonclient.http as httpclient

    first = httpclient.InferInput("embedding", list(embedding.shape), "FP64")
    first.set_data_from_numpy(embedding, binary_data=binary)
    second = httpclient.InferInput("node_count", list(counts.shape), "INT64")
    second.set_data_from_numpy(counts.astype(np.int64), binary_data=binary)
    return [first, second]


def test_tritonclient_sees_a_live_ready_server_and_the_model_metadata(triton: Any) -> None:
    assert triton.is_server_live()
    assert triton.is_server_ready()
    assert triton.is_model_ready("JPCP")
    assert triton.is_model_ready("JPCP", "2")
    assert not triton.is_model_ready("JPCP", "999")
    meta = triton.get_model_metadata("JPCP")
    assert meta["name"] == "JPCP" and meta["platform"] == "sklearn"
    assert {"1", "2"} <= set(meta["versions"])
    assert meta["inputs"] == [
        {"name": "embedding", "datatype": "FP64", "shape": [-1, 384]},
        {"name": "node_count", "datatype": "INT64", "shape": [-1]},
    ]
    assert meta["outputs"] == [{"name": "prediction", "datatype": "FP64", "shape": [-1]}]
    assert "binary_tensor_data" in triton.get_server_metadata()["extensions"]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_gets_the_model_routes_predictions(triton: Any, server: ServingProcess, binary: bool) -> None:
    import tritonclient.http as httpclient

    embedding, counts = rows()
    result = triton.infer(
        "JPCP",
        triton_inputs(embedding, counts, binary=binary),
        request_id="call-7",
        outputs=[httpclient.InferRequestedOutput("prediction", binary_data=binary)],
        parameters={"alias": "Production"},
    )
    response = result.get_response()
    assert (response["model_name"], response["model_version"], response["id"]) == ("JPCP", "1", "call-7")
    assert response["parameters"] == {"alias": "Production"}
    assert ("binary_data_size" in response["outputs"][0].get("parameters", {})) is binary
    assert result.as_numpy("prediction").tolist() == model_route(server, embedding, counts)


def test_tritonclient_default_binary_mode_with_a_pinned_version_and_fp32(triton: Any, server: ServingProcess) -> None:
    embedding, counts = rows(1)
    inputs = triton_inputs(embedding, counts, binary=True)
    as_fp32 = embedding.astype(np.float32)
    import tritonclient.http as httpclient

    inputs[0] = httpclient.InferInput("embedding", [ROWS, 384], "FP32")
    inputs[0].set_data_from_numpy(as_fp32)
    result = triton.infer("jpcp", inputs, model_version="2")  # no outputs named: all of them, in binary
    assert result.get_response()["model_version"] == "2"
    assert result.get_response()["parameters"] == {"alias": "pinned"}
    expected = []
    for row, count in zip(as_fp32.astype(np.float64).tolist(), counts.tolist(), strict=True):
        reply = httpx.post(
            f"{server.url}/v1/models/JPCP/predict",
            json={"embedding": row, "node_count": count, "version": 2},
            headers=server.auth,
        )
        assert reply.status_code == 200, reply.text
        expected.append(reply.json()["prediction"])
    assert result.as_numpy("prediction").tolist() == expected


def test_one_call_is_answered_by_one_version_under_a_traffic_split(server: ServingProcess) -> None:
    httpx.put(
        f"{server.url}/v1/traffic/JPCP", json={"Production": 50, "Canary": 50}, headers=server.auth
    ).raise_for_status()
    try:
        embedding, counts = rows(2)
        body = {
            "inputs": [
                {"name": "embedding", "datatype": "FP64", "shape": [ROWS, 384], "data": embedding.tolist()},
                {"name": "node_count", "datatype": "INT64", "shape": [ROWS], "data": counts.tolist()},
            ]
        }
        versions = set()
        for _ in range(12):
            reply = httpx.post(f"{server.url}/v2/models/JPCP/infer", json=body, timeout=30, headers=server.auth)
            assert reply.status_code == 200, reply.text
            data = reply.json()
            versions.add((data["model_version"], data["parameters"]["alias"]))
            # The model route would split "Production" again: pin the version that answered instead.
            pinned = model_route_version(server, embedding, counts, int(data["model_version"]))
            assert data["outputs"][0]["data"] == pinned
        assert versions == {("1", "Production"), ("2", "Canary")}
    finally:
        httpx.put(f"{server.url}/v1/traffic/JPCP", json={}, headers=server.auth).raise_for_status()


def model_route_version(server: ServingProcess, embedding: Any, counts: Any, version: int) -> list[float]:
    return [
        httpx.post(
            f"{server.url}/v1/models/JPCP/predict",
            json={"embedding": row, "node_count": count, "version": version},
            headers=server.auth,
        ).json()["prediction"]
        for row, count in zip(embedding.tolist(), counts.tolist(), strict=True)
    ]


def test_a_model_failure_is_a_500_marked_for_the_retrain_trigger(triton: Any, server: ServingProcess) -> None:
    # The demo's Staging version fails on purpose.
    embedding, counts = rows(3)
    body = {
        "parameters": {"alias": "staging"},
        "inputs": [
            {"name": "embedding", "datatype": "FP64", "shape": [ROWS, 384], "data": embedding.tolist()},
            {"name": "node_count", "datatype": "INT64", "shape": [ROWS], "data": counts.tolist()},
        ],
    }
    reply = httpx.post(f"{server.url}/v2/models/JPCP/infer", json=body, timeout=30, headers=server.auth)
    assert reply.status_code == 500, reply.text
    assert reply.json()["inference_failed"] is True and reply.json()["code"] == "inference_failed"
    metrics = httpx.get(f"{server.url}/metrics").text  # no token: metrics are open
    failed = [line for line in metrics.splitlines() if line.startswith('examlops_requests_total{alias="Staging"')]
    assert failed and 'outcome="failed"' in failed[0] and float(failed[0].split()[-1]) >= ROWS  # each row counted


def v2_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "bad",
        "inputs": [
            {"name": "embedding", "datatype": "FP32", "shape": [2, 384], "data": [[0.01] * 384, [0.02] * 384]},
            {"name": "node_count", "datatype": "INT64", "shape": [2], "data": [12, 40]},
        ],
    }
    body.update(changes)
    return body


def malformed() -> list[tuple[str, dict[str, Any] | bytes, dict[str, str], int]]:
    wrong_type = v2_body()
    wrong_type["inputs"][0]["datatype"] = "INT32"
    shape = v2_body()
    shape["inputs"][0]["shape"] = [3, 384]
    width = v2_body()
    width["inputs"][0]["shape"], width["inputs"][0]["data"] = [2, 383], [[0.01] * 383] * 2
    missing = v2_body()
    missing["inputs"].pop(1)
    head = json.dumps(
        {
            "inputs": [
                {"name": "embedding", "datatype": "FP32", "shape": [2, 384], "parameters": {"binary_data_size": 3000}},
                {"name": "node_count", "datatype": "INT64", "shape": [2], "parameters": {"binary_data_size": 16}},
            ]
        }
    ).encode()
    short = head + np.zeros((2, 384), np.float32).tobytes() + np.array([1, 2], np.int64).tobytes()
    binary = {"content-type": "application/octet-stream", "inference-header-content-length": str(len(head))}
    return [
        ("wrong datatype", wrong_type, {}, 422),
        ("shape mismatch", shape, {}, 422),
        ("wrong embedding width", width, {}, 422),
        ("missing input", missing, {}, 422),
        ("unknown output", v2_body(outputs=[{"name": "probability"}]), {}, 422),
        ("binary size not the body's", short, binary, 422),
        ("binary without its header length", short, {"content-type": "application/octet-stream"}, 422),
        ("not JSON", b"{inputs: [", {}, 422),
        ("over the limit", b"[" + b"0.5," * 400_000 + b"0.5]", {"content-type": "application/json"}, 413),
        ("an unsupported media type", b"{}", {"content-type": "text/plain"}, 415),
    ]


@pytest.mark.parametrize(("case", "body", "headers", "status"), malformed(), ids=[m[0] for m in malformed()])
def test_malformed_requests_get_a_4xx_with_a_v2_error(
    server: ServingProcess, case: str, body: Any, headers: dict[str, str], status: int
) -> None:
    url = f"{server.url}/v2/models/JPCP/infer"
    if isinstance(body, bytes):
        reply = httpx.post(url, content=body, headers={**headers, **server.auth}, timeout=30)
    else:
        reply = httpx.post(url, json=body, timeout=30, headers=server.auth)
    assert reply.status_code == status, reply.text
    data = reply.json()
    assert isinstance(data["error"], str) and data["error"]
    assert set(data) == V2_ERROR_KEYS and data["inference_failed"] is False  # no prediction, no outputs


def test_the_protocols_example_requests_are_answered_with_4xx_not_5xx(server: ServingProcess) -> None:
    # The inference request example of the protocol's REST specification: its inputs are not this model's.
    example = {
        "id": "42",
        "inputs": [
            {"name": "input0", "shape": [2, 2], "datatype": "UINT32", "data": [1, 2, 3, 4]},
            {"name": "input1", "shape": [3], "datatype": "BOOL", "data": [True]},
        ],
        "outputs": [{"name": "output0"}],
    }
    for path in ("/v2/models/mymodel/infer", "/v2/models/JPCP/infer", "/v2/models/JPCP/versions/1/infer"):
        reply = httpx.post(f"{server.url}{path}", json=example, timeout=30, headers=server.auth)
        assert 400 <= reply.status_code < 500, reply.text
        assert set(reply.json()) == V2_ERROR_KEYS
    assert httpx.get(f"{server.url}/v2/models/mymodel", headers=server.auth).status_code == 404
    assert httpx.get(f"{server.url}/v2/models/mymodel/ready", headers=server.auth).status_code == 404


def test_curl_style_json_without_content_type_is_accepted(server: ServingProcess) -> None:
    reply = httpx.post(
        f"{server.url}/v2/models/JPCP/infer",
        content=json.dumps(v2_body()).encode(),
        headers={"content-type": "", **server.auth},
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["id"] == "bad" and reply.json()["outputs"][0]["shape"] == [2]


def test_without_a_token_health_answers_and_everything_else_is_a_401_v2_error(server: ServingProcess) -> None:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    anonymous = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        assert anonymous.is_server_live() and anonymous.is_server_ready()
        assert anonymous.get_server_metadata()["name"] == "examlops"
        with pytest.raises(InferenceServerException) as refused:
            anonymous.get_model_metadata("JPCP")
        assert refused.value.status() == "401"
    finally:
        anonymous.close()
    reply = httpx.post(f"{server.url}/v2/models/JPCP/infer", json=v2_body(), timeout=30)
    assert reply.status_code == 401 and reply.headers["www-authenticate"] == "Bearer"
    assert set(reply.json()) == V2_ERROR_KEYS and reply.json()["code"] == "unauthenticated"
