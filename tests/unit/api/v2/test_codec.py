"""The V2 codec: JSON and binary tensors in, rows for the model, outputs out; every malformed case refused."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from examlops.api.v2.codec import decode_request, encode_response, model_rows, wanted_outputs
from examlops.core.errors import InvalidInput

DIM = 4


def tensor(name: str, datatype: str, shape: list[int], data: Any) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def good(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "req-1",
        "inputs": [
            tensor("embedding", "FP32", [2, DIM], [[0.5, 0.25, 0.0, -1.0], [1.0, 2.0, 3.0, 4.0]]),
            tensor("node_count", "INT64", [2], [12, 40]),
        ],
    }
    body.update(overrides)
    return body


def binary_body(
    embedding: np.ndarray[Any, Any], counts: np.ndarray[Any, Any], *, extra: bytes = b"", size_delta: int = 0
) -> tuple[bytes, str]:
    """What tritonclient sends with binary_data=True: the JSON, then each input's bytes in order."""
    header = {
        "inputs": [
            {
                "name": "embedding",
                "datatype": "FP32" if embedding.dtype == np.float32 else "FP64",
                "shape": list(embedding.shape),
                "parameters": {"binary_data_size": embedding.nbytes + size_delta},
            },
            {
                "name": "node_count",
                "datatype": "INT64",
                "shape": list(counts.shape),
                "parameters": {"binary_data_size": counts.nbytes},
            },
        ],
        "parameters": {"binary_data_output": True},
    }
    head = json.dumps(header).encode()
    return head + embedding.tobytes() + counts.tobytes() + extra, str(len(head))


def refused(body: bytes | dict[str, Any], header_length: str | None = None) -> InvalidInput:
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    with pytest.raises(InvalidInput) as caught:
        call = decode_request(raw, header_length)
        model_rows(call.tensors, DIM)
        wanted_outputs(call.body, ("prediction",))
    return caught.value


def test_json_rows_nested_or_flat_give_the_same_rows() -> None:
    nested = decode_request(json.dumps(good()).encode())
    flat_body = good()
    flat_body["inputs"][0]["data"] = [0.5, 0.25, 0.0, -1.0, 1.0, 2.0, 3.0, 4.0]
    flat = decode_request(json.dumps(flat_body).encode())
    for call in (nested, flat):
        embeddings, counts = model_rows(call.tensors, DIM)
        assert embeddings.dtype == np.float64 and embeddings.shape == (2, DIM)
        assert embeddings[1].tolist() == [1.0, 2.0, 3.0, 4.0]
        assert counts == [12, 40]
    assert nested.body.id == "req-1"


def test_fp32_json_values_are_rounded_to_float32_as_in_binary() -> None:
    body = good()
    body["inputs"][0]["data"] = [[0.1] * DIM, [0.2] * DIM]
    embeddings, _ = model_rows(decode_request(json.dumps(body).encode()).tensors, DIM)
    assert embeddings[0, 0] == float(np.float32(0.1))


def test_binary_inputs_decode_to_the_same_rows_as_json() -> None:
    embedding = np.array([[0.5, 0.25, 0.0, -1.0], [1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    counts = np.array([12, 40], dtype=np.int64)
    raw, length = binary_body(embedding, counts)
    rows, node_counts = model_rows(decode_request(raw, length).tensors, DIM)
    json_rows, json_counts = model_rows(decode_request(json.dumps(good()).encode()).tensors, DIM)
    assert np.array_equal(rows, json_rows) and node_counts == json_counts


def test_a_node_count_of_shape_n_by_1_is_accepted() -> None:
    body = good()
    body["inputs"][1] = tensor("node_count", "INT32", [2, 1], [[12], [40]])
    assert model_rows(decode_request(json.dumps(body).encode()).tensors, DIM)[1] == [12, 40]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda b: b["inputs"][0].update(datatype="INT64"), "inputs.embedding"),
        (lambda b: b["inputs"][0].update(datatype="BYTES"), "inputs.embedding"),
        (lambda b: b["inputs"][1].update(datatype="FP32", data=[12.0, 40.0]), "inputs.node_count"),
        (lambda b: b["inputs"][1].update(data=[12.5, 40]), "inputs.node_count"),
        (lambda b: b["inputs"][1].update(datatype="INT8", data=[12, 400]), "inputs.node_count"),
        (lambda b: b["inputs"][0].update(shape=[2, DIM + 1]), "inputs.embedding"),
        (lambda b: b["inputs"][0].update(shape=[4, 2]), "inputs.embedding"),
        (lambda b: b["inputs"][0].update(shape=[1, DIM]), "inputs.embedding"),
        (lambda b: b["inputs"][1].update(shape=[3], data=[1, 2, 3]), "inputs.node_count"),
        (lambda b: b["inputs"][0].update(shape=[0, DIM], data=[]), "inputs.embedding"),
        (lambda b: b["inputs"][0].update(data=[[0.5, 0.25], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]]), "inputs.embedding"),
        (lambda b: b["inputs"][0].update(data=[["zzq"] * DIM, [1.0] * DIM]), "inputs.0.data"),
        (lambda b: b["inputs"][0].update(data=[[True] * DIM, [1.0] * DIM]), "inputs.0.data"),
        (lambda b: b["inputs"][0].update(data=[[None] * DIM, [1.0] * DIM]), "inputs.0.data"),
        (lambda b: b["inputs"][0].update(data=[[[1.0]] * DIM, [1.0] * DIM]), "inputs.0.data"),
        (lambda b: b["inputs"][0].pop("data"), "inputs.embedding"),
        (lambda b: b["inputs"].pop(1), "inputs.node_count"),
        (lambda b: b["inputs"].append(tensor("colour", "FP32", [1], [1.0])), "inputs"),
        (lambda b: b["inputs"].append(tensor("embedding", "FP32", [1], [1.0])), "inputs.embedding"),
        (lambda b: b["inputs"][0].pop("datatype"), "inputs.0.datatype"),
        (lambda b: b["inputs"][0].update(shape=[-1, DIM]), "inputs.0.shape.0"),
        (lambda b: b.update(inputs=[]), "inputs"),
        (lambda b: b.update(colour="scarlet"), "colour"),
        (lambda b: b.update(outputs=[{"name": "probability"}]), "outputs.probability"),
        (lambda b: b.update(outputs=[{"name": "prediction"}, {"name": "prediction"}]), "outputs.prediction"),
        (lambda b: b.update(outputs=[{"name": "prediction", "parameters": {"binary_data": "yes"}}]), "outputs"),
        (lambda b: b.update(parameters={"binary_data_output": 1}), "parameters"),
        (lambda b: b.update(id="x" * 300), "id"),
        (lambda b: b["inputs"][0].update(data=[[10**400] * DIM, [1.0] * DIM]), "inputs.embedding"),
        (lambda b: b["inputs"][1].update(data=[2**70, 40]), "inputs.node_count"),
    ],
)
def test_malformed_json_requests_are_refused_naming_the_field(change: Any, field: str) -> None:
    body = good()
    change(body)
    error = refused(body)
    assert error.field is not None and error.field.startswith(field), error
    assert "scarlet" not in error.message and "zzq" not in error.message


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"null", b'{"inputs": [{"name": 1}]}', b"\xff\xfe"])
def test_a_body_that_is_not_a_request_is_refused(raw: bytes) -> None:
    refused(raw)


def test_non_finite_json_numbers_are_refused() -> None:
    raw = json.dumps(good()).replace("0.25", "NaN").encode()
    assert refused(raw).field == "inputs.0.data"
    too_big = json.dumps(good()).replace("0.25", "1e300").encode()  # a double, but no float32
    assert refused(too_big).field == "inputs.embedding"


@pytest.mark.parametrize(
    ("size_delta", "extra", "length_change"),
    [
        (-4, b"", 0),  # the size says fewer bytes than the shape needs
        (4, b"", 0),  # more than the body holds
        (0, b"\x00" * 8, 0),  # bytes after the last input
        (0, b"", 10_000),  # a header length past the body
        (0, b"", None),  # no header length: the binary part is not JSON
    ],
)
def test_binary_sizes_that_do_not_match_the_body_are_refused(
    size_delta: int, extra: bytes, length_change: int | None
) -> None:
    embedding = np.ones((2, DIM), dtype=np.float32)
    raw, length = binary_body(embedding, np.array([12, 40], dtype=np.int64), extra=extra, size_delta=size_delta)
    header = None if length_change is None else str(int(length) + length_change)
    refused(raw, header)


@pytest.mark.parametrize("header", ["abc", "0", "-5", "1.5"])
def test_a_header_length_that_is_not_a_byte_count_is_refused(header: str) -> None:
    raw, _ = binary_body(np.ones((2, DIM), dtype=np.float32), np.array([12, 40], dtype=np.int64))
    assert refused(raw, header).field == "Inference-Header-Content-Length"


def test_data_and_binary_size_together_are_refused() -> None:
    body = good()
    body["inputs"][1]["parameters"] = {"binary_data_size": 16}
    raw = json.dumps(body).encode()
    refused(raw + np.array([12, 40], dtype=np.int64).tobytes(), str(len(raw)))


def test_outputs_default_to_all_and_follow_binary_flags() -> None:
    call = decode_request(json.dumps(good()).encode())
    assert [(o.name, o.binary) for o in wanted_outputs(call.body, ("prediction",))] == [("prediction", False)]
    binary = decode_request(json.dumps(good(parameters={"binary_data_output": True})).encode())
    assert wanted_outputs(binary.body, ("prediction",))[0].binary
    asked = good(
        parameters={"binary_data_output": True},
        outputs=[{"name": "prediction", "parameters": {"binary_data": False}}],
    )
    assert not wanted_outputs(decode_request(json.dumps(asked).encode()).body, ("prediction",))[0].binary


def test_a_json_response_names_model_version_id_and_data() -> None:
    call = decode_request(json.dumps(good()).encode())
    header = {"model_name": "JPCP", "model_version": "2", "id": "req-1", "parameters": {"alias": "Canary"}}
    body, length = encode_response(
        header, wanted_outputs(call.body, ("prediction",)), {"prediction": np.array([1.5, -2.0])}
    )
    assert length is None
    assert json.loads(body) == {
        **header,
        "outputs": [{"name": "prediction", "datatype": "FP64", "shape": [2], "data": [1.5, -2.0]}],
    }


def test_a_binary_response_puts_float64_bytes_after_the_json() -> None:
    call = decode_request(json.dumps(good(parameters={"binary_data_output": True})).encode())
    header = {"model_name": "JPCP", "model_version": "1"}
    body, length = encode_response(
        header, wanted_outputs(call.body, ("prediction",)), {"prediction": np.array([1.5, -2.0])}
    )
    assert length is not None
    head = json.loads(body[:length])
    assert head["outputs"][0]["parameters"] == {"binary_data_size": 16}
    assert "data" not in head["outputs"][0]
    assert np.frombuffer(body[length:], dtype="<f8").tolist() == [1.5, -2.0]
