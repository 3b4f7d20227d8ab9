"""The kserve_v2 adapter at its protocol: the tensors it builds from rows and the outputs it reads back."""

from __future__ import annotations

import pytest

from examlops.inference.adapters.kserve_v2 import EXAMLOPS_V2, KserveV2Adapter, Tensor, V2Target, kserve_v2_adapter
from examlops.inference.errors import InferenceError, Kind
from examlops.inference.ports import Call
from tests.unit.inference.adapters.fakes import Network, reply

ROWS = [{"embedding": [0.1, 0.2], "node_count": 3}, {"embedding": [0.3, 0.4], "node_count": 5}]


def outputs(shape: list[int], data: list[object], name: str = "prediction") -> dict[str, object]:
    return {
        "model_name": "m",
        "model_version": "1",
        "outputs": [{"name": name, "shape": shape, "datatype": "FP64", "data": data}],
    }


async def predict(network: Network, target: V2Target, rows: list[dict[str, object]] = ROWS) -> list[dict[str, object]]:
    adapter = KserveV2Adapter("http://v2", {"score": target}, transport=network.transport)
    await adapter.start()
    try:
        return [dict(r) for r in await adapter.predict_batch("score", rows, Call(route="score", trace_id="t-1"))]
    finally:
        await adapter.close()


async def test_rows_become_one_fp64_tensor_n_by_width_and_a_scalar_output_fills_the_field() -> None:
    network = Network(reply(200, outputs([2], [0.5, 0.25])))
    assert await predict(network, V2Target(model="m")) == [{"prediction": 0.5}, {"prediction": 0.25}]
    assert network.requests[0].url.path == "/v2/models/m/infer"
    (tensor,) = network.bodies[0]["inputs"]
    assert tensor == {
        "name": "input-0",
        "shape": [2, 3],
        "datatype": "FP64",
        "data": [[0.1, 0.2, 3.0], [0.3, 0.4, 5.0]],
    }
    assert network.bodies[0]["id"] == "t-1"


async def test_examlops_v2_tensors_a_version_path_and_parameters() -> None:
    network = Network(reply(200, outputs([2], [0.5, 0.25])))
    await predict(network, V2Target(model="JPCP", version="2", inputs=EXAMLOPS_V2, parameters={"alias": "Canary"}))
    assert network.requests[0].url.path == "/v2/models/JPCP/versions/2/infer"
    body = network.bodies[0]
    assert body["inputs"] == [
        {"name": "embedding", "shape": [2, 2], "datatype": "FP64", "data": [[0.1, 0.2], [0.3, 0.4]]},
        {"name": "node_count", "shape": [2], "datatype": "INT64", "data": [3, 5]},
    ]
    assert body["parameters"] == {"alias": "Canary"}


async def test_an_n_by_k_output_fills_several_fields_in_order_or_one_tensor_field() -> None:
    data = [[0.1, 0.9], [0.7, 0.3]]
    two = V2Target(model="m", output="probs", outputs=("low", "high"))
    network = Network(reply(200, outputs([2, 2], data, "probs")))
    assert await predict(network, two) == [{"low": 0.1, "high": 0.9}, {"low": 0.7, "high": 0.3}]
    assert network.bodies[0]["outputs"] == [{"name": "probs"}]
    flat = Network(reply(200, outputs([2, 2], [0.1, 0.9, 0.7, 0.3], "probs")))
    assert await predict(flat, V2Target(model="m", outputs=("probs",))) == [
        {"probs": [0.1, 0.9]},
        {"probs": [0.7, 0.3]},
    ]


async def test_an_integer_tensor_refuses_a_fraction_before_any_io() -> None:
    network = Network(reply(200, outputs([1], [0.5])))
    target = V2Target(model="m", inputs=(Tensor("n", ("node_count",), "INT64", flat=True),))
    with pytest.raises(InferenceError) as caught:
        await predict(network, target, [{"node_count": 2.5}])
    assert (caught.value.kind, caught.value.backend) == (Kind.VALIDATION, "kserve_v2")
    assert network.requests == []


@pytest.mark.parametrize(
    "body",
    [
        {"outputs": []},
        outputs([3], [0.1, 0.2, 0.3]),
        outputs([2], [0.1]),
        {"error": "not the protocol"},
    ],
    ids=["no-output", "more-rows", "short-data", "no-outputs"],
)
async def test_a_reply_that_is_not_the_protocols_is_infrastructure(body: dict[str, object]) -> None:
    with pytest.raises(InferenceError) as caught:
        await predict(Network(reply(200, body)), V2Target(model="m"))
    assert (caught.value.kind, caught.value.code) == (Kind.INFRASTRUCTURE, "inference_bad_reply")


def test_the_wiring_factory_takes_file_mappings() -> None:
    adapter = kserve_v2_adapter(
        {
            "a": {"model": "JPCP", "version": 1, "inputs": "examlops"},
            "b": {"model": "m", "inputs": [{"name": "x", "fields": ["f"]}], "outputs": ["y"]},
        },
        {"url": "http://s", "token": "k"},
    )
    assert adapter.routes["a"] == V2Target(model="JPCP", version="1", inputs=EXAMLOPS_V2)
    assert adapter.routes["b"] == V2Target(model="m", inputs=(Tensor("x", ("f",)),), outputs=("y",))
    assert adapter.capabilities.streaming is False


async def test_the_token_goes_as_a_bearer_header() -> None:
    network = Network(reply(200, outputs([1], [0.5])))
    adapter = kserve_v2_adapter({"a": {"model": "m"}}, {"url": "http://s", "token": "k"}, transport=network.transport)
    await adapter.start()
    await adapter.predict_batch("a", ROWS[:1], Call(route="a"))
    await adapter.close()
    assert network.requests[0].headers["Authorization"] == "Bearer k"


async def test_an_http_error_names_backend_and_route() -> None:
    with pytest.raises(InferenceError) as caught:
        await predict(Network(reply(404, {"error": "Model m not found"})), V2Target(model="m"))
    assert (caught.value.kind, caught.value.backend, caught.value.route) == (Kind.PRECONDITION, "kserve_v2", "score")
    assert str(caught.value).count("HTTP 404") == 1


async def test_a_third_party_error_text_is_dropped_since_it_may_echo_the_inputs() -> None:
    body = {"error": "could not convert string to float: '123-45-6789'", "code": "bad_input"}
    with pytest.raises(InferenceError) as caught:
        await predict(Network(reply(400, body)), V2Target(model="m"))
    assert "123-45-6789" not in str(caught.value) and "HTTP 400" in str(caught.value)
    assert (caught.value.kind, caught.value.code) == (Kind.VALIDATION, "bad_input")
