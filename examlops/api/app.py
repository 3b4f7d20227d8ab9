"""The serving HTTP API: thin routes over the inference pipeline.

Routes parse, call the pipeline and format; every decision lives in
``examlops.serving``. Errors become replies through the one table in
``examlops.api.errors``; every error reply carries ``"prediction": 0.0``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from examlops.api.auth import SECURED, Authenticator, CurrentCaller, request_caller
from examlops.api.calls import answer, check_ready, declared_budget
from examlops.api.errors import (
    describe_validation,
    documented,
    error_response,
    handle_disconnect,
    handle_examlops,
    handle_http,
    handle_unexpected,
    handle_validation,
)
from examlops.api.jobs import jobs_router
from examlops.api.limits import BodyLimitMiddleware
from examlops.api.schemas import (
    HotSetEntry,
    InferBody,
    InferReply,
    PredictBody,
    ReadyReply,
    ReloadBody,
    ReloadChangeReply,
    ReloadReply,
    TrafficReply,
)
from examlops.api.stream import stream_routes
from examlops.api.tasks import Tasks, task_routes
from examlops.api.traces import traces_router
from examlops.api.tracing import TraceMiddleware, call_of, named_model
from examlops.api.v2 import v2_routes
from examlops.core.budget import effective_deadline
from examlops.core.errors import ExamlopsError, InvalidInput
from examlops.core.messages import InferenceRequest, InferenceResult
from examlops.core.settings import Settings
from examlops.dashboard import dashboard_router
from examlops.identity import Caller, Permission
from examlops.jobs.service import JobService
from examlops.registry.catalog import Catalog
from examlops.tracing import Tracer, TraceStore

log = logging.getLogger(__name__)

ERRORS = documented()


class ServingPipeline(Protocol):
    """What the routes need of the pipeline (``examlops.serving.pipeline.Pipeline``)."""

    catalog: Catalog

    @property
    def ready(self) -> bool: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def infer(self, request: InferenceRequest) -> InferenceResult: ...

    def admit(self, request: InferenceRequest, rows: int = 1) -> float | None: ...

    async def route(self, model: str, alias: str | None = None) -> str: ...

    def hot_set(self) -> Sequence[Any]: ...

    def traffic(self, model: str) -> dict[str, int]: ...

    def set_traffic(self, model: str, weights: Mapping[str, int], actor: str = ...) -> dict[str, int]: ...

    async def reload(self, model: str | None = None, *, actor: str = ...) -> Sequence[Any]: ...


class BackgroundWork(Protocol):
    """Work the app runs beside the routes while it lives (``jobs.runner.JobRunner``)."""

    def start(self) -> None: ...

    async def close(self) -> None: ...


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI request body of a route that parses its own body."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": model.model_json_schema(ref_template="#/components/schemas/{model}")}
            },
        }
    }


def create_app(
    settings: Settings,
    pipeline: ServingPipeline,
    metrics: CollectorRegistry,
    *,
    identities: Authenticator | None,
    tasks: Tasks | None = None,
    tracer: Tracer | None = None,
    traces: TraceStore | None = None,
    jobs: JobService | None = None,
    job_runner: BackgroundWork | None = None,
) -> FastAPI:
    """The serving app. Its lifespan starts the pipeline (the hot set loads in the background) and closes it.

    ``identities`` resolves bearer tokens (``api.auth``); None turns authentication off (development only).
    With ``tasks`` (the composition root always passes the task resolver), `/v1/tasks/{task}/infer` too.
    Every inference call gets a trace id (``X-Examlops-Trace``) and, with a ``tracer`` that has a queue,
    one trace record (``api.tracing``). With ``jobs``, `/v1/jobs` (``api.jobs``); ``job_runner`` starts with
    the app and stops before the pipeline closes, so that its batch in flight is dropped, not failed.
    """
    tracer = tracer or Tracer(None)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def start() -> None:
            await pipeline.start()
            # Everything allocated so far (imports, the hot set) lives as long as the process: move it
            # out of the collector's reach so full collections stay short under load.
            gc.freeze()

        tracer.start()
        starting = asyncio.create_task(start(), name="pipeline-start")
        if job_runner is not None:
            job_runner.start()
        try:
            yield
        finally:
            if job_runner is not None:
                await job_runner.close()
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await starting
            await pipeline.close()
            await asyncio.to_thread(tracer.close)

    app = FastAPI(
        title="examlops serving",
        summary="Predictions from the MLflow registry by alias, through the inference pipeline of seed 000.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.draining = False
    app.state.identities = identities
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.serving.max_body_bytes)
    app.add_middleware(TraceMiddleware, tracer=tracer)  # added last: outermost, so a 413 is traced too
    app.add_exception_handler(RequestValidationError, handle_validation)
    app.add_exception_handler(StarletteHTTPException, handle_http)
    app.add_exception_handler(ExamlopsError, handle_examlops)
    app.add_exception_handler(ClientDisconnect, handle_disconnect)
    app.add_exception_handler(Exception, handle_unexpected)

    async def serve(request: Request, kind: type[PredictBody], path_model: str | None, caller: Caller) -> Response:
        received_at = time.time()
        raw = await request.body()
        call = call_of(request)
        if call is not None:
            call.model = path_model
        # The hot routes parse the body with pydantic-core's JSON parser in one step rather than
        # FastAPI's json.loads followed by validation of Python objects: about a tenth of a
        # millisecond a request, where HTTP and JSON handling is the whole cost.
        try:
            body = kind.model_validate_json(raw)
        except ValidationError as exc:
            field, message = describe_validation(exc.errors(include_input=False))
            if call is not None and call.model is None:
                call.model = named_model(raw)
            return error_response(InvalidInput(message, field=field), model=path_model)
        model = body.model if isinstance(body, InferBody) else path_model or ""
        facts = call.facts if call is not None else None
        if call is not None:
            call.model, call.job_id, call.alias = model, body.job_id, body.alias
        try:
            budget_ms = declared_budget(request, body.budget_ms)
            deadline = effective_deadline(body.deadline, budget_ms, received_at)
            if call is not None:
                call.budget_ms, call.deadline = budget_ms, deadline
            caller.may_call(model=model)
            check_ready(pipeline, request)
            if body.alias is not None and body.version is not None:
                raise InvalidInput("give either alias or version, not both", field="version")
            result = await pipeline.infer(
                InferenceRequest(
                    model=model,
                    embedding=tuple(body.embedding),
                    node_count=body.node_count,
                    alias=body.alias,
                    version=None if body.version is None else str(body.version),
                    job_id=body.job_id,
                    user_id=body.user_id,
                    deadline=deadline,
                    facts=facts,
                    budget_ms=budget_ms,
                    identity=caller.name,
                )
            )
        except ExamlopsError as exc:
            return error_response(exc, model=model, job_id=body.job_id)
        if call is not None:
            call.model, call.alias, call.version = result.model, result.alias, result.version
        reply = answer(result, budget_ms=budget_ms, deadline=deadline)
        return Response(reply.model_dump_json(exclude={"task"}), media_type="application/json")

    @app.post(
        "/infer-pipeline/infer",
        response_model=InferReply,
        responses=ERRORS,
        tags=["inference"],
        openapi_extra=json_body(InferBody) | SECURED,
    )
    async def infer(request: Request) -> Response:
        """One prediction through the pipeline: the route the bus bridge calls."""
        return await serve(request, InferBody, None, await request_caller(request))

    @app.post(
        "/v1/models/{model}/predict",
        response_model=InferReply,
        responses=ERRORS,
        tags=["inference"],
        openapi_extra=json_body(PredictBody) | SECURED,
    )
    async def predict(model: str, request: Request) -> Response:
        """One prediction for direct callers (`exa predict`, dashboards, agents); records nothing."""
        caller = await request_caller(request)
        caller.may_call(model=model)
        return await serve(request, PredictBody, model, caller)

    if tasks is not None:
        app.include_router(task_routes(pipeline, tasks))
    app.include_router(v2_routes(pipeline))
    app.include_router(stream_routes(pipeline, tasks, settings))

    @app.get("/v1/models", response_model=list[HotSetEntry], tags=["models"])
    async def models(caller: CurrentCaller) -> list[HotSetEntry]:
        """The hot set: every model and alias in memory, with its version and state."""
        return [HotSetEntry(**asdict(entry)) for entry in pipeline.hot_set()]

    @app.get("/v1/traffic/{model}", response_model=TrafficReply, responses=ERRORS, tags=["traffic"])
    async def get_traffic(model: str, caller: CurrentCaller) -> TrafficReply:
        """The traffic split applied to requests addressed to the model's default alias."""
        spec = pipeline.catalog.get(model)
        return TrafficReply(model=spec.name, weights=await asyncio.to_thread(pipeline.traffic, spec.name))

    @app.put("/v1/traffic/{model}", response_model=TrafficReply, responses=ERRORS, tags=["traffic"])
    async def put_traffic(model: str, weights: dict[str, int], caller: CurrentCaller) -> TrafficReply:
        """Set the split, e.g. `{"Production": 90, "Canary": 10}`: weights sum to 100 and name existing aliases."""
        caller.require(Permission.SET_TRAFFIC)
        spec = pipeline.catalog.get(model)
        stored = await asyncio.to_thread(pipeline.set_traffic, spec.name, weights, caller.name)
        return TrafficReply(model=spec.name, weights=stored)

    @app.post("/admin/reload", response_model=ReloadReply, responses=ERRORS, tags=["models"])
    async def reload(caller: CurrentCaller, body: ReloadBody | None = None) -> ReloadReply:
        """Ask MLflow now whether any alias in memory moved; load, swap, release. Answers with what changed."""
        caller.require(Permission.RELOAD)
        model = pipeline.catalog.get(body.model).name if body and body.model else None
        changes = await pipeline.reload(model, actor=caller.name)
        return ReloadReply(changes=[ReloadChangeReply(**asdict(change)) for change in changes])

    if traces is not None:
        app.include_router(traces_router(traces))
    if jobs is not None:
        app.include_router(jobs_router(jobs))
    app.include_router(dashboard_router(settings, pipeline, metrics, traces=traces, jobs=jobs))

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """Alive: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", response_model=ReadyReply, tags=["health"])
    async def readyz() -> JSONResponse:
        """200 once the hot set is loaded, 503 before, and 503 again while draining for shutdown."""
        body = ReadyReply(
            ready=pipeline.ready and not app.state.draining,
            models=[HotSetEntry(**asdict(e)) for e in pipeline.hot_set()],
        )
        return JSONResponse(body.model_dump(), status_code=200 if body.ready else 503)

    @app.get("/metrics", tags=["health"])
    async def prometheus() -> Response:
        """Prometheus metrics: requests by model, alias and outcome; latency; batch sizes; in flight."""
        return Response(generate_latest(metrics), media_type=CONTENT_TYPE_LATEST)

    return app
