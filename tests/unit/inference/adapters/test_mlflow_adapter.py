"""The mlflow adapter at its protocol: tensor and dataframe bodies, the replies of MLflow 1, 2 and 3."""

from __future__ import annotations

import pytest

from examlops.inference.adapters.mlflow import MlflowAdapter, MlflowTarget, mlflow_adapter
from examlops.inference.errors import InferenceError, Kind
from examlops.inference.ports import Call
from tests.unit.inference.adapters.fakes import Network, reply

ROWS = [{"embedding": [0.1, 0.2], "node_count": 3}, {"embedding": [0.3, 0.4], "node_count": 5}]


async def predict(
    network: Network, target: MlflowTarget, rows: list[dict[str, object]] = ROWS
) -> list[dict[str, object]]:
    adapter = MlflowAdapter("http://mlflow", {"score": target}, transport=network.transport)
    await adapter.start()
    try:
        return [dict(r) for r in await adapter.predict_batch("score", rows, Call(route="score"))]
    finally:
        await adapter.close()


async def test_a_tensor_signature_gets_inputs_and_the_predictions_fill_the_field() -> None:
    network = Network(reply(200, {"predictions": [0.5, 0.25]}))
    assert await predict(network, MlflowTarget()) == [{"prediction": 0.5}, {"prediction": 0.25}]
    assert network.requests[0].url.path == "/invocations"
    assert network.bodies[0] == {"inputs": [[0.1, 0.2, 3.0], [0.3, 0.4, 5.0]]}


async def test_a_dataframe_signature_with_named_columns_splits_the_flat_vector() -> None:
    network = Network(reply(200, {"predictions": [0.5, 0.25]}))
    await predict(network, MlflowTarget(format="dataframe", columns=("e0", "e1", "n")))
    assert network.bodies[0] == {
        "dataframe_split": {"columns": ["e0", "e1", "n"], "data": [[0.1, 0.2, 3.0], [0.3, 0.4, 5.0]]}
    }


async def test_a_dataframe_signature_without_columns_sends_the_rows_fields_as_they_are() -> None:
    network = Network(reply(200, {"predictions": [0.5, 0.25]}))
    await predict(network, MlflowTarget(format="dataframe"))
    assert network.bodies[0] == {
        "dataframe_split": {"columns": ["embedding", "node_count"], "data": [[[0.1, 0.2], 3], [[0.3, 0.4], 5]]}
    }


async def test_columns_that_do_not_match_the_width_are_refused_before_any_io() -> None:
    network = Network(reply(200, {"predictions": [0.5, 0.25]}))
    with pytest.raises(InferenceError) as caught:
        await predict(network, MlflowTarget(format="dataframe", columns=("a", "b")))
    assert caught.value.kind is Kind.VALIDATION and network.requests == []


@pytest.mark.parametrize(
    ("body", "target", "expected"),
    [
        ([0.5, 0.25], MlflowTarget(), [{"prediction": 0.5}, {"prediction": 0.25}]),
        ({"predictions": [{"p": 0.5}, {"p": 0.25}]}, MlflowTarget(), [{"prediction": 0.5}, {"prediction": 0.25}]),
        (
            {"predictions": [{"lo": 0.1, "hi": 0.9}, {"lo": 0.7, "hi": 0.3}]},
            MlflowTarget(outputs=("hi", "lo")),
            [{"hi": 0.9, "lo": 0.1}, {"hi": 0.3, "lo": 0.7}],
        ),
        (
            {"predictions": [[0.1, 0.9], [0.7, 0.3]]},
            MlflowTarget(outputs=("probs",)),
            [{"probs": [0.1, 0.9]}, {"probs": [0.7, 0.3]}],
        ),
    ],
    ids=["mlflow1-bare-list", "one-column-records", "named-columns", "vectors"],
)
async def test_every_reply_shape_of_the_scoring_server(
    body: object, target: MlflowTarget, expected: list[dict[str, object]]
) -> None:
    assert await predict(Network(reply(200, body)), target) == expected


async def test_a_model_that_raised_is_a_model_failure_and_its_message_never_echoes_the_input() -> None:
    body = {
        "error_code": "BAD_REQUEST",
        "message": "Encountered an unexpected error while evaluating the model. data [[0.1, 0.2, 3.0]]",
    }
    with pytest.raises(InferenceError) as caught:
        await predict(Network(reply(400, body)), MlflowTarget())
    assert (caught.value.kind, caught.value.code) == (Kind.MODEL_FAILURE, "mlflow_bad_request")
    assert "0.1" not in str(caught.value)


async def test_a_schema_refusal_is_validation() -> None:
    body = {"error_code": "BAD_REQUEST", "message": "Failed to predict data '[[0.1]]'. Error: Failed to enforce schema"}
    with pytest.raises(InferenceError) as caught:
        await predict(Network(reply(400, body)), MlflowTarget())
    assert (caught.value.kind, caught.value.code) == (Kind.VALIDATION, "mlflow_bad_request")
    assert "0.1" not in str(caught.value)


async def test_the_scoring_servers_own_timeout_is_a_timeout() -> None:
    with pytest.raises(InferenceError) as caught:
        await predict(Network(reply(504, None)), MlflowTarget())
    assert caught.value.kind is Kind.TIMEOUT


async def test_a_reply_with_a_prediction_missing_is_refused_whole() -> None:
    with pytest.raises(InferenceError) as caught:
        await predict(Network(reply(200, {"predictions": [0.5]})), MlflowTarget())
    assert (caught.value.kind, caught.value.code) == (Kind.VALIDATION, "inference_output_mismatch")


def test_the_wiring_factory_takes_file_mappings_each_route_on_its_own_server() -> None:
    adapter = mlflow_adapter(
        {"a": {"format": "dataframe", "columns": ["x"]}, "b": {"url": "http://other:5001"}}, {"url": "http://s"}
    )
    assert adapter.routes["a"] == MlflowTarget(format="dataframe", columns=("x",))
    assert adapter.routes["b"] == MlflowTarget(url="http://other:5001")
    with pytest.raises(ValueError):
        mlflow_adapter({"a": {}}, {})  # no server for the route
    with pytest.raises(ValueError):
        MlflowTarget(format="csv")  # type: ignore[arg-type]  # not a format, on purpose


async def test_each_route_calls_its_own_scoring_server_through_one_client() -> None:
    network = Network(reply(200, {"predictions": [0.5]}))
    targets = {"a": MlflowTarget(url="http://one:5000/"), "b": MlflowTarget(url="http://two:5000")}
    adapter = mlflow_adapter(targets, {}, transport=network.transport)
    await adapter.start()
    for route in ("a", "b"):
        await adapter.predict_batch(route, ROWS[:1], Call(route=route))
    await adapter.close()
    assert [str(r.url) for r in network.requests] == ["http://one:5000/invocations", "http://two:5000/invocations"]
