"""The serving HTTP API: thin routes over the inference pipeline.

Routes parse, call the pipeline and format; every decision lives in
``examlops.serving``. Errors become replies through the one table in
``examlops.api.errors``; every error reply carries ``"prediction": 0.0``.
``create_app`` assembles the app (lifespan, middleware, error handlers) and holds the model, traffic,
reload, health and metrics routes; the inference routes are their own modules (``predict``, ``tasks``,
``stream``, ``v2``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict
from typing import Any, Protocol

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from examlops.api.auth import Authenticator, CurrentCaller
from examlops.api.errors import (
    documented,
    handle_disconnect,
    handle_examlops,
    handle_http,
    handle_unexpected,
    handle_validation,
)
from examlops.api.jobs import jobs_router
from examlops.api.limits import BodyLimitMiddleware
from examlops.api.predict import predict_routes
from examlops.api.schemas import (
    HotSetEntry,
    ReadyReply,
    ReloadBody,
    ReloadChangeReply,
    ReloadReply,
    TrafficReply,
)
from examlops.api.stream import stream_routes
from examlops.api.task_calls import Tasks
from examlops.api.tasks import task_routes
from examlops.api.traces import traces_router
from examlops.api.tracing import TraceMiddleware
from examlops.api.v2 import v2_routes
from examlops.core.collector import PauseMeter, quiet_collector
from examlops.core.errors import ExamlopsError
from examlops.core.messages import InferenceRequest, InferenceResult
from examlops.core.settings import Settings
from examlops.dashboard import dashboard_router
from examlops.identity import Permission
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

    def check_traffic(self, model: str, weights: Mapping[str, int]) -> dict[str, int]: ...

    def set_traffic(self, model: str, weights: Mapping[str, int], actor: str = ...) -> dict[str, int]: ...

    async def reload(self, model: str | None = None, *, actor: str = ...) -> Sequence[Any]: ...


class BackgroundWork(Protocol):
    """Work the app runs beside the routes while it lives (``jobs.runner.JobRunner``)."""

    def start(self) -> None: ...

    async def close(self) -> None: ...


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
    collector: BackgroundWork | None = None,
) -> FastAPI:
    """The serving app. Its lifespan starts the pipeline (the hot set loads in the background) and closes it.

    ``identities`` resolves bearer tokens (``api.auth``); None turns authentication off (development only).
    With ``tasks`` (the composition root always passes the task resolver), `/v1/tasks/{task}/infer` too.
    Every inference call gets a trace id (``X-Examlops-Trace``) and, with a ``tracer`` that has a queue,
    one trace record (``api.tracing``). With ``jobs``, `/v1/jobs` (``api.jobs``); ``job_runner`` starts with
    the app and stops before the pipeline closes, so that its batch in flight is dropped, not failed.
    The app registers ``examlops_gc_pause_seconds`` on ``metrics`` (one app per registry: a second raises
    prometheus_client's duplicate error) and its lifespan hooks the garbage collector (``gc.callbacks``) from
    start to end (``core.collector.PauseMeter``). ``collector`` (the composition root's
    ``core.collector.LoadGovernor``) runs from the end of a start-up that succeeded to the start of shutdown.
    """
    tracer = tracer or Tracer(None)
    pauses = PauseMeter(metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def start() -> None:
            await pipeline.start()
            # Everything allocated so far (imports, the hot set) lives as long as the process: out of the
            # collector's reach, and young objects collected rarely (core.collector).
            quiet_collector()
            if collector is not None:
                collector.start()

        pauses.start()
        try:  # the collector's hook leaves with the app, however start-up or shutdown ends
            tracer.start()
            starting = asyncio.create_task(start(), name="pipeline-start")
            try:
                if job_runner is not None:
                    job_runner.start()
                yield
            finally:
                starting.cancel()  # first: a start-up that ends now must not start the governor after its close
                with contextlib.suppress(asyncio.CancelledError, Exception):  # the rest of shutdown runs regardless
                    await starting
                if collector is not None:
                    await collector.close()
                if job_runner is not None:
                    await job_runner.close()
                await pipeline.close()
                await asyncio.to_thread(tracer.close)
        finally:
            pauses.stop()

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

    app.include_router(predict_routes(pipeline))
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
        """Prometheus metrics: requests by model, alias and outcome; latency; batch sizes; in flight; the garbage
        collector's pauses."""
        return Response(generate_latest(metrics), media_type=CONTENT_TYPE_LATEST)

    return app
