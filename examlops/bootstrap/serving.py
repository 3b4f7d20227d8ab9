"""The serving assembly: the FastAPI app over the pipeline, with its real adapters, on uvicorn.

``ServingProcess(settings).run()`` loads the hot set and serves in the foreground until SIGTERM/SIGINT or
``close()`` (from any thread), draining requests in flight (``api.server``). ``serving_app(settings)`` is
the app alone, for an ASGI server of the caller's choice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from examlops.bootstrap.control import control_events
from examlops.bootstrap.sql import sql_engine
from examlops.core.settings import Settings
from examlops.registry.catalog import Catalog, load_catalog

if TYPE_CHECKING:
    from fastapi import FastAPI

    from examlops.registry.mlflow_registry import MlflowRegistry


def catalog(settings: Settings) -> Catalog:
    return load_catalog(settings.catalog_path, embedding_dim=settings.embedding_dim)


def model_registry(settings: Settings) -> MlflowRegistry:
    from examlops.registry.mlflow_registry import MlflowRegistry

    settings.mlflow_dir.mkdir(parents=True, exist_ok=True)
    return MlflowRegistry(settings.mlflow_tracking_uri, settings.state_dir / "cache" / "models")


def serving_app(settings: Settings) -> FastAPI:
    """The serving app with its real adapters: MLflow hot set, process predict pool, SQL traffic rules."""
    from prometheus_client import CollectorRegistry

    from examlops.api.app import create_app
    from examlops.bootstrap.identity import identity_resolver
    from examlops.registry.loader import load_sklearn_model
    from examlops.serving.pipeline import Pipeline
    from examlops.serving.pool import ProcessPredictPool
    from examlops.serving.traffic_store import SqlTrafficRuleStore

    metrics = CollectorRegistry()
    engine = sql_engine(settings)
    pipeline = Pipeline(
        settings,
        catalog(settings),
        model_registry(settings),
        SqlTrafficRuleStore(engine),
        ProcessPredictPool(load_sklearn_model, workers=settings.predict.workers, timeout_s=settings.predict.timeout_s),
        registry=metrics,
        on_event=control_events(settings, engine),
    )
    return create_app(settings, pipeline, metrics, identities=identity_resolver(settings, engine))


def prepare_platform(settings: Settings, on_progress: Callable[[str], None] | None = None) -> None:
    """What `exa up` does before starting the services (after it upgraded the SQL schema): demo models."""
    from examlops.registry.demo import seed_demo

    settings.state_dir.mkdir(parents=True, exist_ok=True)
    report = seed_demo(settings, catalog(settings), on_progress)
    if on_progress is not None and report.created:
        on_progress(f"registered demo models: {', '.join(report.created)}")


class ServingProcess:
    """Serving in the foreground: ``host``/``port`` default to the settings'."""

    def __init__(
        self, settings: Settings, *, host: str | None = None, port: int | None = None, log_level: str = "warning"
    ) -> None:
        from examlops.api.server import draining_server

        self.settings = settings
        self.server = draining_server(
            serving_app(settings),
            host=host or settings.serving.host,
            port=port or settings.serving.port,
            grace_s=settings.serving.drain_grace_s,
            log_level=log_level,
        )

    def run(self) -> None:
        self.server.run()

    def close(self) -> None:
        """Start the drain, as a SIGTERM does."""
        import signal

        self.server.handle_exit(signal.SIGTERM, None)
