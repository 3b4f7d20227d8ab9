"""Tensors of the Open Inference Protocol in and out: JSON and the binary tensor data extension.

Pure functions over bytes, no I/O. Every malformed request is an ``InvalidInput`` naming the field
(``inputs.embedding``, ``outputs.x``, ``body``); the values are never echoed.

- ``decode_request(body, header_length)``: with ``header_length`` (the ``Inference-Header-Content-Length``
  header) the first that many bytes are the JSON and the rest holds, in input order, the
  ``parameters.binary_data_size`` bytes of each binary input (little-endian, row-major); the sizes must
  add up to exactly the bytes after the JSON. Without it the whole body is JSON. Each tensor must have as
  many elements as its shape says, of a type its datatype can hold (integers for integer types, in range).
- ``model_rows(tensors, dim)``: the two inputs of every examlops model, ``embedding`` (FP32 or FP64,
  ``[n, dim]``) and ``node_count`` (an integer type, ``[n]`` or ``[n, 1]``), as ``n`` rows.
- ``wanted_outputs`` and ``encode_response``: the outputs asked for (all when none are named), each in
  JSON or binary as ``parameters.binary_data`` (or the request's ``binary_data_output``) says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from examlops.api.errors import shown
from examlops.api.v2.schemas import InferenceRequestBody, InferenceResponseBody, RequestInput, ResponseOutput
from examlops.core.errors import InvalidInput

HEADER_LENGTH = "Inference-Header-Content-Length"

DTYPES: dict[str, str] = {
    "BOOL": "?",
    "UINT8": "<u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "INT8": "<i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
}
"""The protocol's fixed-size datatypes and their little-endian numpy types (BYTES is not one of ours)."""
FLOAT_TYPES = ("FP32", "FP64")
INTEGER_TYPES = ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")


@dataclass(frozen=True, slots=True)
class DecodedRequest:
    """A request whose tensors are arrays of their declared datatype and shape."""

    body: InferenceRequestBody
    tensors: dict[str, tuple[str, npt.NDArray[Any]]]
    """Input name -> (datatype, array)."""


@dataclass(frozen=True, slots=True)
class Output:
    """One output to send: its name and whether it travels in binary."""

    name: str
    binary: bool


def _describe(exc: ValidationError) -> InvalidInput:
    first = exc.errors(include_input=False)[0]
    parts = [p for p in first["loc"] if isinstance(p, int) or ("[" not in p and p not in ("int", "float"))]
    if "data" in parts:
        parts = parts[: parts.index("data") + 1]  # the element's position would say which value was bad
    field = shown(".".join(str(p) for p in parts) or "body")  # a key the caller made up shows as a prefix
    if "data" in parts:
        message = "must hold JSON numbers only (no strings, booleans, nulls, NaN or Infinity), nested at most once"
    elif first["type"] == "json_invalid":
        message = "the body is not valid JSON"
    elif first["type"] == "missing":
        message = "is required"
    elif first["type"] == "extra_forbidden":
        message = "is not a field of the protocol"
    else:
        message = str(first.get("msg", "is not valid"))
    return InvalidInput(f"{field}: {message}", field=field)


def _split(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    if header_length is None:
        return body, b""
    try:
        length = int(header_length)
    except ValueError:
        raise InvalidInput(f"{HEADER_LENGTH} must be a whole number of bytes", field=HEADER_LENGTH) from None
    if not 0 < length <= len(body):
        raise InvalidInput(f"{HEADER_LENGTH} must be between 1 and the body's {len(body)} bytes", field=HEADER_LENGTH)
    return body[:length], body[length:]


def _binary_size(spec: RequestInput, field: str) -> int | None:
    size = (spec.parameters or {}).get("binary_data_size")
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidInput(f"{field}: binary_data_size must be a whole number of bytes", field=field)
    return size


def _from_json(data: list[Any], datatype: str, count: int, field: str) -> npt.NDArray[Any]:
    try:
        values = np.array(data)
    except ValueError:
        raise InvalidInput(f"{field}: nested data must be rows of equal length", field=field) from None
    if values.size != count:
        raise InvalidInput(f"{field}: the shape says {count} elements, the data holds {values.size}", field=field)
    if values.size and values.dtype.kind not in "biuf":  # strings, nulls, or integers past 64 bits
        raise InvalidInput(f"{field}: the data must be numbers that fit in 64 bits", field=field)
    if datatype == "BOOL":
        raise InvalidInput(f"{field}: BOOL tensors must be sent in binary", field=field)
    dtype = np.dtype(DTYPES[datatype])
    if dtype.kind in "iu":
        if values.size and values.dtype.kind not in "iu":
            raise InvalidInput(f"{field}: {datatype} data must be integers", field=field)
        info = np.iinfo(dtype)
        if values.size and (int(values.min()) < info.min or int(values.max()) > info.max):
            raise InvalidInput(f"{field}: a value is outside the range of {datatype}", field=field)
    with np.errstate(over="ignore"):
        typed = values.astype(dtype).reshape(-1)
    if dtype.kind == "f" and not np.isfinite(typed).all():
        raise InvalidInput(f"{field}: a value does not fit in {datatype}", field=field)
    return typed


def _tensor(spec: RequestInput, chunk: bytes | None, field: str) -> npt.NDArray[Any]:
    if spec.datatype not in DTYPES:
        known = ", ".join(DTYPES)
        raise InvalidInput(f"{field}: datatype must be one of {known}", field=field)
    count = math.prod(spec.shape)
    if chunk is not None:
        if spec.data is not None:
            raise InvalidInput(f"{field}: give data or binary_data_size, not both", field=field)
        itemsize = np.dtype(DTYPES[spec.datatype]).itemsize
        if len(chunk) != count * itemsize:
            raise InvalidInput(
                f"{field}: binary_data_size is {len(chunk)} bytes, the shape and datatype need {count * itemsize}",
                field=field,
            )
        flat = np.frombuffer(chunk, dtype=DTYPES[spec.datatype])
    elif spec.data is None:
        raise InvalidInput(f"{field}: data is missing (nor is binary_data_size given)", field=field)
    else:
        flat = _from_json(spec.data, spec.datatype, count, field)
    return flat.reshape(spec.shape)


def decode_request(body: bytes, header_length: str | None = None) -> DecodedRequest:
    """The request's JSON and tensors (contract in the module docstring); ``InvalidInput`` otherwise."""
    head, rest = _split(body, header_length)
    try:
        request = InferenceRequestBody.model_validate_json(head)
    except ValidationError as exc:
        raise _describe(exc) from None
    tensors: dict[str, tuple[str, npt.NDArray[Any]]] = {}
    offset = 0
    for spec in request.inputs:
        field = f"inputs.{spec.name[:64]}"
        if spec.name in tensors:
            raise InvalidInput(f"{field}: named twice", field=field)
        size = _binary_size(spec, field)
        chunk = None
        if size is not None:
            if offset + size > len(rest):
                raise InvalidInput(
                    f"{field}: binary_data_size runs past the {len(rest)} bytes after the JSON", field=field
                )
            chunk, offset = rest[offset : offset + size], offset + size
        tensors[spec.name] = (spec.datatype, _tensor(spec, chunk, field))
    if offset != len(rest):
        raise InvalidInput(
            f"the binary_data_size of the inputs add up to {offset} bytes, but {len(rest)} follow the JSON",
            field="body",
        )
    return DecodedRequest(request, tensors)


def model_rows(
    tensors: Mapping[str, tuple[str, npt.NDArray[Any]]], dim: int
) -> tuple[npt.NDArray[np.float64], list[int]]:
    """(embeddings ``[n, dim]`` as float64, node counts) of the two inputs every examlops model takes.

    ``InvalidInput`` for a missing or unknown input, a datatype outside FP32/FP64 (embedding) or the
    integer types (node_count), a shape other than ``[n, dim]`` and ``[n]`` or ``[n, 1]`` with the same
    ``n`` of at least one row.
    """
    for name in tensors:
        if name not in ("embedding", "node_count"):
            raise InvalidInput(
                f"inputs.{name[:64]}: not an input of this model (embedding, node_count)", field="inputs"
            )
    for name in ("embedding", "node_count"):
        if name not in tensors:
            raise InvalidInput(f"inputs.{name}: is required", field=f"inputs.{name}")
    kind, embedding = tensors["embedding"]
    if kind not in FLOAT_TYPES:
        raise InvalidInput("inputs.embedding: datatype must be FP32 or FP64", field="inputs.embedding")
    if embedding.ndim != 2 or embedding.shape[0] < 1 or embedding.shape[1] != dim:
        raise InvalidInput(f"inputs.embedding: shape must be [n, {dim}] with n >= 1", field="inputs.embedding")
    kind, counts = tensors["node_count"]
    if kind not in INTEGER_TYPES:
        raise InvalidInput("inputs.node_count: datatype must be an integer type", field="inputs.node_count")
    rows = embedding.shape[0]
    if counts.shape not in ((rows,), (rows, 1)):
        raise InvalidInput(
            f"inputs.node_count: shape must be [{rows}] or [{rows}, 1], as many rows as the embedding",
            field="inputs.node_count",
        )
    return embedding.astype(np.float64), [int(v) for v in counts.reshape(-1).tolist()]


def _binary_flag(parameters: Mapping[str, Any] | None, key: str, field: str) -> bool | None:
    value = (parameters or {}).get(key)
    if value is not None and not isinstance(value, bool):
        raise InvalidInput(f"{field}: {key} must be true or false", field=field)
    return value


def wanted_outputs(request: InferenceRequestBody, available: Sequence[str]) -> list[Output]:
    """The outputs to send, in the order asked (every output when none is named); ``InvalidInput`` names an
    output the model does not have or one asked for twice."""
    default = _binary_flag(request.parameters, "binary_data_output", "parameters") or False
    if not request.outputs:
        return [Output(name, default) for name in available]
    outputs: list[Output] = []
    for asked in request.outputs:
        field = f"outputs.{asked.name[:64]}"
        if asked.name not in available:
            raise InvalidInput(f"{field}: not an output of this model ({', '.join(available)})", field=field)
        if any(o.name == asked.name for o in outputs):
            raise InvalidInput(f"{field}: named twice", field=field)
        binary = _binary_flag(asked.parameters, "binary_data", field)
        outputs.append(Output(asked.name, default if binary is None else binary))
    return outputs


def encode_response(
    header: Mapping[str, Any], outputs: Sequence[Output], values: Mapping[str, npt.NDArray[np.float64]]
) -> tuple[bytes, int | None]:
    """(body, JSON length) of a response: ``header`` (model_name, model_version, id, parameters) with each
    output as FP64 ``[n]``, JSON ``data`` or binary after the JSON. The JSON length is None when nothing
    is binary (then the body is all JSON and needs no ``Inference-Header-Content-Length``)."""
    described: list[ResponseOutput] = []
    binary: list[bytes] = []
    for output in outputs:
        array = np.ascontiguousarray(values[output.name], dtype="<f8").reshape(-1)
        shape = [int(array.shape[0])]
        if output.binary:
            raw = array.tobytes()
            binary.append(raw)
            described.append(
                ResponseOutput(
                    name=output.name, shape=shape, datatype="FP64", parameters={"binary_data_size": len(raw)}
                )
            )
        else:
            described.append(ResponseOutput(name=output.name, shape=shape, datatype="FP64", data=array.tolist()))
    head = InferenceResponseBody(outputs=described, **header).model_dump_json(exclude_none=True).encode()
    if not binary:
        return head, None
    return b"".join([head, *binary]), len(head)
