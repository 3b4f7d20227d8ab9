"""Bodies of the Open Inference Protocol's REST API (KServe V2), where untrusted input meets pydantic.

Request bodies are strict: unknown fields are refused, a shape is a list of non-negative integers, and
tensor ``data`` holds JSON numbers only, flat or nested one level (``[1, 2]`` or ``[[1], [2]]``): strings,
booleans, nulls, NaN and Infinity are refused. Whether the numbers fit the tensor's datatype and shape is
the codec's business (``api.v2.codec``). Reply bodies are the protocol's, plus ``code`` and
``inference_failed`` on errors so callers and the retrain trigger can tell a schema error from a model
failure.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

Number = StrictInt | Annotated[float, Field(strict=True, allow_inf_nan=False)]
TensorData = list[Number] | list[list[Number]]
Parameters = dict[str, Any]

MAX_RANK = 8
"""A shape longer than this is refused before its product is computed."""
MAX_ID = 256
"""The longest request ``id`` echoed back."""


class RequestInput(BaseModel):
    """One input tensor: ``data`` in the JSON, or ``parameters.binary_data_size`` bytes after it."""

    model_config = ConfigDict(extra="forbid")

    name: StrictStr
    shape: Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(max_length=MAX_RANK)]
    datatype: StrictStr
    parameters: Parameters | None = None
    data: TensorData | None = None


class RequestOutput(BaseModel):
    """One output the caller wants; ``parameters.binary_data: true`` asks for it in binary."""

    model_config = ConfigDict(extra="forbid")

    name: StrictStr
    parameters: Parameters | None = None


class InferenceRequestBody(BaseModel):
    """``POST /v2/models/{model}[/versions/{version}]/infer``: the JSON part of a request."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "example": {
                "id": "42",
                "parameters": {"alias": "Canary"},
                "inputs": [
                    {"name": "embedding", "shape": [2, 4], "datatype": "FP32", "data": [[0.01] * 4, [0.02] * 4]},
                    {"name": "node_count", "shape": [2], "datatype": "INT64", "data": [12, 40]},
                ],
                "outputs": [{"name": "prediction"}],
            }
        },
    )

    id: Annotated[StrictStr, Field(max_length=MAX_ID)] | None = None
    parameters: Parameters | None = None
    """``alias`` picks an alias (unset: the default alias and its traffic split); ``binary_data_output``
    asks for every output in binary. Other parameters are ignored."""
    inputs: Annotated[list[RequestInput], Field(min_length=1, max_length=16)]
    outputs: Annotated[list[RequestOutput], Field(max_length=16)] | None = None


class ResponseOutput(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    parameters: Parameters | None = None
    data: list[float] | None = None
    """Absent when the output travels in binary (``parameters.binary_data_size`` bytes after the JSON)."""


class InferenceResponseBody(BaseModel):
    model_name: str
    model_version: str
    id: str | None = None
    parameters: Parameters | None = None
    """``alias``: the alias that answered (``pinned`` for a version in the path)."""
    outputs: list[ResponseOutput]


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    """``-1`` for the batch dimension: any number of rows."""


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    """The registry versions in memory (the aliases' versions), or the one version asked for."""
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]
    parameters: Parameters | None = None


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class Live(BaseModel):
    live: bool


class Ready(BaseModel):
    ready: bool


class V2ErrorReply(BaseModel):
    """Every V2 error: the protocol's ``error`` message, our error ``code``, and whether the model failed."""

    error: str
    code: str
    inference_failed: bool = False
