"""The Open Inference Protocol's REST routes (KServe V2) over the inference pipeline.

- ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready`` (200, or 400 ``{"ready": false}`` while the hot
  set loads or serving drains: the protocol's "4xx means false").
- ``GET /v2/models/{model}[/versions/{version}]``: metadata from the catalog's input schema; the versions
  are those in memory. ``.../ready``: 200 once the default alias (or that version) is loaded, else 400.
- ``POST /v2/models/{model}[/versions/{version}]/infer``: ``n`` rows in one request (``api.v2.codec``),
  each an ``InferenceRequest`` through the same pipeline as the model route (validation, micro-batching,
  hot set, metrics), answered together. Without a version the alias is drawn ONCE from the traffic
  split (or taken from ``parameters.alias``) and every row is sent to it, so one version answers the
  call; a version in the path pins it. A failed row fails the call: the model failure first
  (``inference_failed: true``, counted by the retrain trigger), else the first row's error. The call is
  one trace (``api.tracing`` traces every path ending in ``/infer``): model, alias, version, the request
  ``id`` as its job id, and the batch facts its rows noted.

Every error is ``{"error": ..., "code": ..., "inference_failed": ...}`` with the status of
``api.errors.STATUS``; malformed requests are 4xx, never a 5xx nor a prediction. Each route takes the
same dependencies as the model route (the caller, ``api.auth.CurrentCaller``; infer checks ``may_call`` on
the model, as the model route does), in the one function behind each pair of paths. ``/v2`` and
``/v2/health/...`` take none, as ``/healthz`` and ``/readyz``: probes carry no token.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from examlops import __version__
from examlops.api.auth import CurrentCaller
from examlops.api.errors import error_response, shown
from examlops.api.tracing import call_of
from examlops.api.v2.codec import HEADER_LENGTH, decode_request, encode_response, model_rows, wanted_outputs
from examlops.api.v2.schemas import (
    InferenceRequestBody,
    InferenceResponseBody,
    Live,
    ModelMetadata,
    Ready,
    ServerMetadata,
    TensorMetadata,
    V2ErrorReply,
)
from examlops.core.errors import ExamlopsError, InvalidInput, NotReady, VersionNotFound
from examlops.core.messages import InferenceRequest, InferenceResult
from examlops.registry.catalog import Catalog, ModelSpec

EXTENSIONS = ["binary_tensor_data"]
PLATFORM = "sklearn"
OUTPUTS = ("prediction",)
MAX_VERSION = 2**31 - 1

V2_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": V2ErrorReply, "description": text}
    for status, text in (
        (400, "not live, not ready (health and model ready routes only)"),
        (401, "no bearer token, or one that is not valid (every route but /v2 and /v2/health/...)"),
        (403, "the identity lacks the permission to call the model"),
        (404, "unknown model, alias or version"),
        (408, "the request's headers or body came too slowly (the connection is closed)"),
        (413, "body over the size limit"),
        (415, "the body is neither JSON nor application/octet-stream with Inference-Header-Content-Length"),
        (422, "malformed: datatype, shape, missing input, unknown output, binary sizes (never a model failure)"),
        (500, "the model raised or returned nothing (inference_failed: true)"),
        (503, "not ready, or a dependency is unavailable"),
        (504, "the prediction ran past the hard limit"),
    )
}


class V2Pipeline(Protocol):
    """What the routes need of the pipeline (``examlops.serving.pipeline.Pipeline``)."""

    catalog: Catalog

    @property
    def ready(self) -> bool: ...

    def hot_set(self) -> Sequence[Any]: ...

    async def route(self, model: str, alias: str | None = None) -> str: ...

    async def infer(self, request: InferenceRequest) -> InferenceResult: ...


def v2_error(error: ExamlopsError) -> JSONResponse:
    return error_response(error, v2=True)


def _version(raw: str | None) -> str | None:
    """The registry version a path names; ``VersionNotFound`` for anything but 1 to 2**31-1."""
    if raw is None:
        return None
    if not re.fullmatch(r"[0-9]{1,10}", raw) or not 1 <= int(raw) <= MAX_VERSION:
        raise VersionNotFound(f"{shown(raw)!r} is not a registry version (1 to {MAX_VERSION})")
    return str(int(raw))


def _versions(pipeline: V2Pipeline, spec: ModelSpec) -> list[str]:
    loaded = {e.version for e in pipeline.hot_set() if e.model == spec.name and e.state == "ready" and e.version}
    return sorted(loaded, key=int)


def _metadata(spec: ModelSpec, versions: list[str]) -> ModelMetadata:
    dim = spec.embedding_dim
    return ModelMetadata(
        name=spec.name,
        versions=versions,
        platform=PLATFORM,
        inputs=[
            TensorMetadata(name="embedding", datatype="FP64", shape=[-1, dim]),
            TensorMetadata(name="node_count", datatype="INT64", shape=[-1]),
        ],
        outputs=[TensorMetadata(name="prediction", datatype="FP64", shape=[-1])],
        parameters={"default_alias": spec.default_alias_canonical, "embedding_datatypes": ["FP32", "FP64"]},
    )


def _failure(outcomes: Sequence[InferenceResult | BaseException]) -> BaseException | None:
    """The error that fails the call: a model failure before any other, else the first."""
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    for error in errors:
        if isinstance(error, ExamlopsError) and error.model_failure:
            return error
    return errors[0] if errors else None


def v2_routes(pipeline: V2Pipeline) -> APIRouter:
    """The V2 routes over ``pipeline`` (contract above)."""
    router = APIRouter(tags=["open inference protocol (V2)"], responses=V2_ERRORS)

    def serving(request: Request) -> bool:
        return pipeline.ready and not request.app.state.draining

    @router.get("/v2", response_model=ServerMetadata)
    async def server_metadata() -> ServerMetadata:
        """Server metadata: name, version and the protocol extensions spoken (binary tensor data)."""
        return ServerMetadata(name="examlops", version=__version__, extensions=EXTENSIONS)

    @router.get("/v2/health/live", response_model=Live)
    async def live() -> Live:
        """Alive: the process answers."""
        return Live(live=True)

    @router.get("/v2/health/ready", response_model=Ready)
    async def ready(request: Request) -> JSONResponse:
        """200 once the hot set is loaded; 400 before, and while draining for shutdown."""
        ok = serving(request)
        return JSONResponse(Ready(ready=ok).model_dump(), status_code=200 if ok else 400)

    async def model_metadata(model: str, request: Request, caller: CurrentCaller) -> Response:
        """Model metadata: platform, the versions in memory, inputs and outputs with datatypes and shapes."""
        try:
            spec = pipeline.catalog.get(model)
            version = _version(request.path_params.get("version"))
            versions = _versions(pipeline, spec)
            if version is not None:
                if version not in versions:
                    raise VersionNotFound(f"version {version} of {spec.name} is not in memory")
                versions = [version]
        except ExamlopsError as exc:
            return v2_error(exc)
        return Response(_metadata(spec, versions).model_dump_json(exclude_none=True), media_type="application/json")

    async def model_ready(model: str, request: Request, caller: CurrentCaller) -> Response:
        """200 when the model's default alias (or the version in the path) is loaded and serving, else 400."""
        try:
            spec = pipeline.catalog.get(model)
            version = _version(request.path_params.get("version"))
        except ExamlopsError as exc:
            return v2_error(exc)
        loaded = _versions(pipeline, spec)
        defaults = [e for e in pipeline.hot_set() if e.model == spec.name and e.alias == spec.default_alias_canonical]
        ok = serving(request) and (
            version in loaded if version is not None else any(e.state == "ready" for e in defaults)
        )
        return JSONResponse(Ready(ready=ok).model_dump(), status_code=200 if ok else 400)

    async def infer(model: str, request: Request, caller: CurrentCaller) -> Response:
        """Inference on `n` rows: JSON, or binary tensor data (`application/octet-stream` with
        `Inference-Header-Content-Length`); inputs `embedding` and `node_count`, output `prediction`."""
        trace = call_of(request)
        if trace is not None:
            trace.model = model[:128]
        try:
            caller.may_call(model=model)
            spec = pipeline.catalog.get(model)
            version = _version(request.path_params.get("version"))
            call = decode_request(await request.body(), request.headers.get(HEADER_LENGTH))
            embeddings, counts = model_rows(call.tensors, spec.embedding_dim)
            outputs = wanted_outputs(call.body, OUTPUTS)
            alias = (call.body.parameters or {}).get("alias")
            if alias is not None and not (isinstance(alias, str) and 0 < len(alias) <= 128):
                raise InvalidInput("parameters.alias must be an alias name", field="parameters.alias")
            if alias is not None and version is not None:
                raise InvalidInput("give either an alias or a version in the path, not both", field="parameters.alias")
            if not serving(request):
                raise NotReady("the hot set is still loading" if not pipeline.ready else "serving is shutting down")
            if version is None:
                alias = await pipeline.route(spec.name, alias)
            if trace is not None:
                trace.model, trace.alias, trace.job_id = (
                    spec.name,
                    alias,
                    None if call.body.id is None else call.body.id[:128],
                )
            outcomes = await asyncio.gather(
                *(
                    pipeline.infer(
                        InferenceRequest(
                            model=spec.name,
                            embedding=tuple(row),
                            node_count=count,
                            alias=alias,
                            version=version,
                            routed=version is None,
                            facts=None if trace is None else trace.facts,  # every row notes its batch: the last wins
                        )
                    )
                    for row, count in zip(embeddings.tolist(), counts, strict=True)
                ),
                return_exceptions=True,
            )
            failure = _failure(outcomes)
            if failure is not None:
                raise failure
        except ExamlopsError as exc:
            return v2_error(exc)
        results = [o for o in outcomes if isinstance(o, InferenceResult)]
        if trace is not None:
            trace.model, trace.alias, trace.version = results[0].model, results[0].alias, results[0].version
        header = {
            "model_name": results[0].model,
            "model_version": results[0].version,
            "id": call.body.id,
            "parameters": {"alias": results[0].alias},
        }
        body, head = encode_response(header, outputs, {"prediction": np.array([r.prediction for r in results])})
        if head is None:
            return Response(body, media_type="application/json")
        return Response(body, media_type="application/octet-stream", headers={HEADER_LENGTH: str(head)})

    version_param = {"parameters": [{"name": "version", "in": "path", "required": True, "schema": {"type": "string"}}]}
    infer_body = {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": InferenceRequestBody.model_json_schema(ref_template="#/components/schemas/{model}")
                },
                "application/octet-stream": {
                    "schema": {"type": "string", "format": "binary"},
                    "description": "The JSON (Inference-Header-Content-Length bytes), then each binary input",
                },
            },
        }
    }
    for prefix, extra in (("/v2/models/{model}", {}), ("/v2/models/{model}/versions/{version}", version_param)):
        router.add_api_route(prefix, model_metadata, methods=["GET"], response_model=ModelMetadata, openapi_extra=extra)
        router.add_api_route(f"{prefix}/ready", model_ready, methods=["GET"], response_model=Ready, openapi_extra=extra)
        router.add_api_route(
            f"{prefix}/infer",
            infer,
            methods=["POST"],
            response_model=InferenceResponseBody,
            openapi_extra={**extra, **infer_body},
        )
    return router
