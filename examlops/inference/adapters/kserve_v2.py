"""The kserve_v2 adapter: any Open Inference Protocol server (examlops' ``/v2`` routes, MLServer, Triton,
KServe) over its REST API.

A route's ``V2Target`` names the model (and optionally a version: ``POST /v2/models/{name}[/versions/{v}]
/infer``) and how rows become input tensors: each ``Tensor`` takes the named row fields (None: every
field, in the row's order, which is the spec input's), flattened by ``codec.row_vector``, as a tensor of
shape ``[n, width]`` (``[n]`` with ``flat=True``, for a one-value input) and its datatype (``FP64`` by
default; an integer datatype needs integral values, else ``VALIDATION``). The default is the seed's one
FP64 tensor ``input-0`` of every field. examlops' own V2 routes take two tensors, which ``EXAMLOPS_V2``
names: ``embedding`` FP64 ``[n, dim]`` and ``node_count`` INT64 ``[n]``.

The reply's output tensor (``output``, else the first) has ``n`` rows: shape ``[n]`` gives one scalar a
row, ``[n, k]`` a vector of ``k``; ``codec.output_rows`` maps them to the target's ``outputs`` fields.
``parameters`` are sent as the request's (examlops reads ``alias``). One call carries every row: native
batching, with no cap of the protocol's own (``max_batch`` declares a server's body limit). No streaming.

Failures as ``wire`` maps them; the protocol's error body is ``{"error": ...}`` (examlops adds ``code``
and ``inference_failed``). A 200 whose output is missing or of the wrong size is ``INFRASTRUCTURE``
(``inference_bad_reply``) or, when it does not fit the output fields, ``VALIDATION``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import quote

import httpx

from examlops.inference.adapters import codec
from examlops.inference.adapters.http_adapter import HttpAdapter
from examlops.inference.adapters.remote_config import KserveV2Settings, TensorRoute, V2Route, settings_of, targets_of
from examlops.inference.adapters.wire import HttpBackend, error_of, malformed
from examlops.inference.errors import InferenceError, Kind
from examlops.inference.ports import Call, Capabilities, Row

BACKEND = "kserve_v2"
INTEGER_TYPES = frozenset({"INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"})


@dataclass(frozen=True, slots=True)
class Tensor:
    """One input tensor built from row fields."""

    name: str = "input-0"
    fields: tuple[str, ...] | None = None
    datatype: str = "FP64"
    flat: bool = False
    """Shape ``[n]`` (each row gives exactly one value) instead of ``[n, width]``."""

    def encode(self, rows: Sequence[Row], route: str) -> dict[str, Any]:
        matrix = codec.rows_matrix(rows, self.fields)
        width = len(matrix[0]) if matrix else 0
        if self.flat and width != 1:
            raise InferenceError(
                Kind.VALIDATION, f"{self.name}: a flat tensor takes one value a row", backend=BACKEND, route=route
            )
        data: list[Any] = [[_typed(v, self, route) for v in vector] for vector in matrix]
        if self.flat:
            return {"name": self.name, "shape": [len(rows)], "datatype": self.datatype, "data": [r[0] for r in data]}
        return {"name": self.name, "shape": [len(rows), width], "datatype": self.datatype, "data": data}


def _typed(value: float, tensor: Tensor, route: str) -> float | int:
    if tensor.datatype not in INTEGER_TYPES:
        return value
    if not value.is_integer():
        raise InferenceError(
            Kind.VALIDATION, f"{tensor.name}: {tensor.datatype} takes integers", backend=BACKEND, route=route
        )
    return int(value)


@dataclass(frozen=True, slots=True)
class V2Target:
    """A model on the server, the tensors rows become, and the output fields its reply fills."""

    adapter: ClassVar[str] = BACKEND
    model: str
    version: str | None = None
    inputs: tuple[Tensor, ...] = (Tensor(),)
    output: str | None = None
    """The output tensor to read (None: the first of the reply)."""
    outputs: tuple[str, ...] = ("prediction",)
    parameters: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, raw: V2Target | Mapping[str, Any]) -> V2Target:
        """A target, or one from a wiring file's mapping: ``model``, ``version``, ``inputs`` (a list of
        ``{name, fields, datatype, flat}``, or ``"examlops"`` for ``EXAMLOPS_V2``), ``output``, ``outputs``,
        ``parameters``."""
        if isinstance(raw, V2Target):
            return raw
        parsed = V2Route.model_validate(dict(raw))
        tensors = (
            EXAMLOPS_V2
            if parsed.inputs == "examlops"
            else tuple(Tensor(**t.model_dump()) for t in parsed.inputs or [TensorRoute()])
        )
        return cls(
            model=parsed.model,
            version=parsed.version,
            inputs=tensors,
            output=parsed.output,
            outputs=parsed.outputs,
            parameters=dict(parsed.parameters),
        )

    def path(self) -> str:
        base = f"/v2/models/{quote(self.model, safe='')}"
        return f"{base}/versions/{quote(self.version, safe='')}/infer" if self.version else f"{base}/infer"


EXAMLOPS_V2 = (Tensor("embedding", ("embedding",), "FP64"), Tensor("node_count", ("node_count",), "INT64", flat=True))
"""The input tensors of examlops' own V2 routes, from rows of ``embedding`` and ``node_count``."""


class KserveV2Adapter(HttpAdapter[V2Target]):
    """An Open Inference Protocol server at ``url``; ``routes`` maps each route to its target."""

    backend = BACKEND

    def __init__(
        self,
        url: str,
        routes: Mapping[str, V2Target],
        *,
        headers: Mapping[str, str] | None = None,
        max_batch: int | None = None,
        default_timeout_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.capabilities = Capabilities(native_batching=True, max_batch=max_batch)
        http = HttpBackend(
            url, backend=BACKEND, headers=headers, default_timeout_s=default_timeout_s, transport=transport
        )
        super().__init__(routes, http)

    async def predict_batch(self, route: str, rows: Sequence[Row], call: Call) -> Sequence[Row]:
        target = self.batch_target(route, rows)
        if not rows:
            return []
        with self.blamed(route):
            inputs = [tensor.encode(rows, route) for tensor in target.inputs]
        body: dict[str, Any] = {"inputs": inputs}
        if target.parameters:
            body["parameters"] = dict(target.parameters)
        if call.trace_id:
            body["id"] = call.trace_id
        if target.output is not None:
            body["outputs"] = [{"name": target.output}]
        response = await self._http.post(target.path(), call, json=body)
        if response.status_code != 200:
            raise error_of(response, backend=BACKEND, route=route)
        values = _output_values(response, target.output, len(rows), route)
        with self.blamed(route):
            return codec.output_rows(values, target.outputs, len(rows))


def _output_values(response: httpx.Response, name: str | None, count: int, route: str) -> list[Any]:
    """The output tensor's data as ``count`` rows (a scalar or a vector each)."""
    try:
        outputs = response.json()["outputs"]
        chosen = next(o for o in outputs if name is None or o["name"] == name)
        shape, data = [int(d) for d in chosen["shape"]], chosen["data"]
    except (ValueError, KeyError, TypeError, StopIteration) as exc:
        raise malformed("no such output tensor with data", backend=BACKEND, route=route) from exc
    flat = _flatten(data)
    if not shape or shape[0] != count or len(flat) != _product(shape):
        raise malformed(f"output shape {shape} for {count} rows", backend=BACKEND, route=route)
    width = _product(shape[1:])
    if len(shape) == 1:
        return flat
    return [flat[i * width : (i + 1) * width] for i in range(count)]


def _flatten(data: Any) -> list[Any]:
    if isinstance(data, list) and data and isinstance(data[0], list):
        return [v for part in data for v in _flatten(part)]
    return list(data) if isinstance(data, list) else [data]


def _product(dims: Sequence[int]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


def kserve_v2_adapter(
    targets: Mapping[str, V2Target | Mapping[str, Any]],
    settings: Mapping[str, Any],
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> KserveV2Adapter:
    """The wiring's factory (``register_adapter("kserve_v2", kserve_v2_adapter)``): every route wired to
    kserve_v2, and the shared ``settings``: ``url`` (required), ``token`` (sent as a bearer token),
    ``max_batch``, ``default_timeout_s``."""
    shared = settings_of(KserveV2Settings, BACKEND, settings)
    return KserveV2Adapter(
        shared.url,
        targets_of(BACKEND, V2Target.of, targets),
        headers={"Authorization": f"Bearer {shared.token}"} if shared.token else None,
        max_batch=shared.max_batch,
        default_timeout_s=shared.default_timeout_s,
        transport=transport,
    )
