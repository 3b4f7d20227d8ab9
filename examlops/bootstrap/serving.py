"""The serving assembly: the FastAPI app over the pipeline, with its real adapters, on uvicorn.

``ServingProcess(settings).run()`` loads the hot set and serves in the foreground until SIGTERM/SIGINT or
``close()`` (from any thread), draining requests in flight (``api.server``). ``serving_app(settings)`` is
the app alone, for an ASGI server of the caller's choice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from examlops.bootstrap.control import AuditHook, control_events
from examlops.bootstrap.jobs import offline_jobs
from examlops.bootstrap.sql import sql_engine
from examlops.bootstrap.tasks import seed_task_map
from examlops.bootstrap.tracing import call_tracer, trace_reader
from examlops.core.settings import Settings
from examlops.registry.catalog import Catalog, load_catalog

UP_ACTOR = "system:exa-up"
"""The actor of the alias events of the demo seed `exa up` runs."""
DEMO_SEED_BY = "demo seed"
"""``by`` of the alias events of the demo seed."""

if TYPE_CHECKING:
    from fastapi import FastAPI
    from prometheus_client import CollectorRegistry

    from examlops.core.collector import LoadGovernor
    from examlops.registry.demo import SeedReport
    from examlops.registry.mlflow_client import HttpLimits
    from examlops.registry.mlflow_registry import MlflowRegistry
    from examlops.serving.pipeline import Pipeline
    from examlops.serving.ports import PredictRuntime


def catalog(settings: Settings) -> Catalog:
    return load_catalog(settings.catalog_path, embedding_dim=settings.embedding_dim)


def model_registry(settings: Settings) -> MlflowRegistry:
    from examlops.registry.mlflow_registry import MlflowRegistry

    settings.mlflow_dir.mkdir(parents=True, exist_ok=True)
    return MlflowRegistry(
        settings.mlflow_tracking_uri, settings.state_dir / "cache" / "models", limits=mlflow_limits(settings)
    )


def mlflow_limits(settings: Settings) -> HttpLimits:
    """What bounds each HTTP request to an MLflow server: ``mlflow.timeout_s`` and ``mlflow.max_retries``."""
    from examlops.registry.mlflow_client import HttpLimits

    return HttpLimits(timeout_s=settings.mlflow.timeout_s, max_retries=settings.mlflow.max_retries)


def serving_app(settings: Settings, runtime: PredictRuntime | None = None) -> FastAPI:
    """The serving app with its real adapters: MLflow hot set, process predict pool, SQL traffic rules, the
    dashboard's sources (``bootstrap.dashboard``), and the task resolver over the SQL task map (seeded first
    with catalog tasks it lacks, so that `exa serve start` alone serves every catalog task; an operator's
    remap is never touched). ``runtime`` replaces the process predict pool (the Ray engine passes its
    deployments')."""
    from prometheus_client import CollectorRegistry

    from examlops.api.app import create_app
    from examlops.bootstrap.dashboard import dashboard_sources
    from examlops.bootstrap.identity import identity_resolver
    from examlops.dashboard import attach_sources
    from examlops.registry.loader import WARM_MODULES, load_sklearn_model
    from examlops.serving.pipeline import Pipeline
    from examlops.serving.pool import ProcessPredictPool
    from examlops.serving.traffic_store import SqlTrafficRuleStore
    from examlops.tasks.resolver import TaskResolver
    from examlops.tasks.sql import SqlTaskMap

    metrics = CollectorRegistry()
    engine = sql_engine(settings)
    models = catalog(settings)
    events = control_events(settings, engine)
    seed_task_map(engine, models, events)
    tracer = call_tracer(settings, engine, metrics, in_child=True)
    if runtime is None:
        workers, timeout_s = settings.predict.workers, settings.predict.timeout_s
        warm = ("examlops.serving.pool_worker", *WARM_MODULES)
        runtime = ProcessPredictPool(load_sklearn_model, workers=workers, timeout_s=timeout_s, preload=warm)
    pipeline = Pipeline(
        settings,
        models,
        model_registry(settings),
        SqlTrafficRuleStore(engine),
        runtime,
        registry=metrics,
        on_event=events,
    )
    tasks = TaskResolver(SqlTaskMap(engine), settings.traffic.rules_ttl_s)
    jobs, job_runner = offline_jobs(settings, engine, tasks, pipeline, tracer)
    collector = load_governor(settings, pipeline, metrics)
    app = create_app(
        settings,
        pipeline,
        metrics,
        tasks=tasks,
        tracer=tracer,
        traces=trace_reader(engine),
        identities=identity_resolver(settings, engine),
        jobs=jobs,
        job_runner=job_runner,
        collector=collector,
    )
    attach_sources(app, dashboard_sources(settings, engine, events))
    return app


def load_governor(settings: Settings, pipeline: Pipeline, metrics: CollectorRegistry) -> LoadGovernor | None:
    """Serving's collector governor over ``pipeline``'s calls in flight; None with ``serving.collector_pause_at`` 0."""
    from examlops.core.collector import LoadGovernor

    pause_at = settings.serving.collector_pause_at
    return LoadGovernor(lambda: pipeline.in_flight, metrics, pause_at=pause_at) if pause_at else None


def prepare_platform(settings: Settings, on_progress: Callable[[str], None] | None = None) -> None:
    """What `exa up` does before starting the services (after it upgraded the SQL schema, once Redis is up):
    demo models, their aliases on the audit trail as ``UP_ACTOR``'s (``seed_demo_audited``), and the catalog's
    tasks the task map lacks (an operator's remap is never touched)."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    models = catalog(settings)
    engine = sql_engine(settings)
    try:
        events = control_events(settings, engine)
        report = seed_demo_audited(settings, models, on_progress, actor=UP_ACTOR, audit=events)
        if on_progress is not None and report.created:
            on_progress(f"registered demo models: {', '.join(report.created)}")
        created = seed_task_map(engine, models, events)
    finally:
        engine.dispose()
    if on_progress is not None and created:
        on_progress(f"mapped tasks: {', '.join(f'{r.task} -> {r.model}@{r.alias}' for r in created)}")


def seed_demo_audited(
    settings: Settings,
    models: Catalog,
    on_progress: Callable[[str], None] | None = None,
    *,
    actor: str,
    audit: AuditHook | None = None,
) -> SeedReport:
    """``registry.demo.seed_demo`` with every alias it points moved as intent, then outcome, on the audit trail
    (``audited_moves``; ``actor``, ``by`` "demo seed"), so that `exa audit verify` covers the demo's aliases.
    Redis is asked first (SQL is checked when the hook is built): with the trail unavailable the seed stops
    before it trains anything (``StoreUnavailable``, ``SchemaNotCurrent``)."""
    from examlops.adapters.redis import translated
    from examlops.bootstrap.moves import audited_moves
    from examlops.core.errors import StoreUnavailable
    from examlops.registry.demo import seed_demo

    with audited_moves(settings, actor, DEMO_SEED_BY, audit) as trail:
        try:
            with translated("the audit trail"):
                trail.client.ping()
        except StoreUnavailable as exc:
            exc.add_note("the demo seed writes every alias it points to the audit trail: nothing was seeded")
            raise
        return seed_demo(settings, models, on_progress, trail=trail)


class ServingProcess:
    """Serving in the foreground: ``host``/``port`` default to the settings'."""

    def __init__(
        self, settings: Settings, *, host: str | None = None, port: int | None = None, log_level: str = "warning"
    ) -> None:
        from examlops.api.server import draining_server

        self.settings = settings
        self.server = draining_server(
            serving_app(settings),
            settings.serving,
            host=host or settings.serving.host,
            port=port or settings.serving.port,
            log_level=log_level,
        )

    def run(self) -> None:
        self.server.run()

    def close(self) -> None:
        """Start the drain, as a SIGTERM does."""
        import signal

        self.server.handle_exit(signal.SIGTERM, None)
