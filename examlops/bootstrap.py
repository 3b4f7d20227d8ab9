"""The composition root: the one place that picks real adapters from the settings.

Nothing here runs at import time; every function builds what it is asked for.
Heavy imports (mlflow) stay inside the functions so that the CLI starts fast.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel, create_engine

from examlops.core.settings import Settings
from examlops.registry.catalog import Catalog, load_catalog

if TYPE_CHECKING:
    from fastapi import FastAPI
    from prometheus_client import CollectorRegistry

    from examlops.monitoring.audit import AuditTrail
    from examlops.monitoring.recorder import Backlog, Recorder, Tuning
    from examlops.registry.mlflow_registry import MlflowRegistry


def catalog(settings: Settings) -> Catalog:
    return load_catalog(settings.catalog_path, embedding_dim=settings.embedding_dim)


def sql_engine(settings: Settings) -> Engine:
    """The SQLModel engine with every table created; SQLite in the state folder unless a URL is set."""
    url = settings.sql_url
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _wal(dbapi_connection: object, _record: object) -> None:
            # WAL lets serving read rules while a CLI writes them.
            cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]  # DB-API connection
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.close()
    else:
        engine = create_engine(url, pool_pre_ping=True)
    # Import the table modules so that create_all knows every table.
    import examlops.monitoring.audit_store
    import examlops.monitoring.drift_store
    import examlops.serving.traffic_store  # noqa: F401

    _create_tables(engine)
    return engine


def _create_tables(engine: Engine, attempts: int = 5) -> None:
    """``create_all``, safe when several processes start on a fresh database at once.

    ``create_all`` checks which tables exist, then creates the rest: two processes (serving and a bridge
    under `exa up`) can both see a table missing, and the second CREATE fails with "already exists"
    (on Postgres a unique violation in its catalog). Checking again then finds the table and skips it.
    """
    from sqlalchemy.exc import DatabaseError

    for attempt in range(attempts):
        try:
            SQLModel.metadata.create_all(engine)
            return
        except DatabaseError as exc:
            if attempt == attempts - 1 or not ("already exists" in str(exc) or "duplicate key" in str(exc)):
                raise
            time.sleep(0.05 * (attempt + 1))


def model_registry(settings: Settings) -> MlflowRegistry:
    from examlops.registry.mlflow_registry import MlflowRegistry

    settings.mlflow_dir.mkdir(parents=True, exist_ok=True)
    return MlflowRegistry(settings.mlflow_tracking_uri, settings.state_dir / "cache" / "models")


def serving_app(settings: Settings) -> FastAPI:
    """The serving app with its real adapters: MLflow hot set, process predict pool, SQL traffic rules."""
    from prometheus_client import CollectorRegistry

    from examlops.api.app import create_app
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
    return create_app(settings, pipeline, metrics)


def prepare_platform(settings: Settings, on_progress: Callable[[str], None] | None = None) -> None:
    """What `exa up` does before starting the services: state folders, SQL tables, demo models."""
    from examlops.registry.demo import seed_demo

    settings.state_dir.mkdir(parents=True, exist_ok=True)
    sql_engine(settings).dispose()
    report = seed_demo(settings, catalog(settings), on_progress)
    if on_progress is not None and report.created:
        on_progress(f"registered demo models: {', '.join(report.created)}")


def control_events(settings: Settings, engine: Engine) -> Callable[[str, str, Mapping[str, Any]], None]:
    """Appends control actions (traffic changes, reloads, refusals) to the audit trail, signing each one.

    Control actions are rare and each is checkpointed at once, so a serving process that stops never
    leaves unsigned events of its own behind. Redis is reached on first use.
    """
    from examlops.monitoring.audit import AuditTrail, connect
    from examlops.monitoring.audit_store import SqlCheckpointStore

    trail = AuditTrail(
        connect(settings.redis_url), settings.secret.get_secret_value().encode(), SqlCheckpointStore(engine)
    )

    def append(type: str, subject: str, data: Mapping[str, Any]) -> None:
        trail.append(type, subject, data)
        trail.checkpoint_now()

    return append


@contextmanager
def audit_trail(settings: Settings) -> Iterator[AuditTrail]:
    """The audit trail on the settings' Redis, with checkpoints in SQL; closes both on exit."""
    from examlops.monitoring.audit import AuditTrail, connect
    from examlops.monitoring.audit_store import SqlCheckpointStore

    client = connect(settings.redis_url)
    engine = sql_engine(settings)
    trail = AuditTrail(
        client,
        settings.secret.get_secret_value().encode(),
        SqlCheckpointStore(engine),
        checkpoint_every=settings.audit.checkpoint_every,
        checkpoint_interval_s=settings.audit.checkpoint_interval_s,
    )
    try:
        yield trail
    finally:
        with suppress(Exception):  # a last checkpoint is best effort when Redis or SQL is gone
            trail.checkpoint_now()
        client.close()
        engine.dispose()


def settings_json(settings: Settings) -> str:
    """The settings as JSON that ``Settings.model_validate_json`` reads back whole, the secret included."""
    import json

    data = settings.model_dump(mode="json")
    data["secret"] = settings.secret.get_secret_value()
    return json.dumps(data)


def recording_process_argv() -> list[str]:
    """`exa bridge recorder`, logging at the level of this process's root logger."""
    import logging

    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
    return [sys.executable, "-m", "examlops.cli.main", "bridge", "recorder", "--log-level", level]


@contextmanager
def bridge_recording(settings: Settings, metrics: CollectorRegistry | None = None) -> Iterator[Backlog]:
    """What the bridge records through: snapshots, audit events, the failure windows and retrain requests.

    The records are written by a child process at a low CPU priority (``settings.recording``; see
    ``monitoring.recorder_process``), or by a thread of the bridge; retrain requests go through a Redis
    outbox delivered to the Prefect deployment `retrain/retrain` by another thread. Both are flushed and
    stopped on exit.
    """
    from examlops.monitoring.recorder_process import RecorderProcess
    from examlops.monitoring.retrain import OutboxDelivery, PrefectRetrainRequester, RedisOutbox

    with audit_trail(settings) as trail:
        recorder: Backlog
        if settings.recording.process:
            recorder = RecorderProcess(
                recording_process_argv(),
                settings_json(settings),
                nice=settings.recording.nice,
                tick=trail.tick,  # the bridge's own events (retrain requests) get checkpointed
                registry=metrics,
            ).start()
        else:
            recorder = redis_recorder(settings, trail, registry=metrics).start()
        delivery = OutboxDelivery(RedisOutbox(trail.redis), PrefectRetrainRequester(settings.prefect_api_url), trail)
        delivery.start()
        try:
            yield recorder
        finally:
            recorder.close(10)
            delivery.close()


def redis_recorder(
    settings: Settings, trail: AuditTrail, tuning: Tuning | None = None, *, registry: CollectorRegistry | None = None
) -> Recorder:
    """The recorder that writes to Redis (snapshots, audit events, failure windows), not yet started."""
    from examlops.monitoring.failures import FailureTracker, RedisFailureStore
    from examlops.monitoring.recorder import DEFAULT_TUNING, Recorder

    tracker = FailureTracker(RedisFailureStore(trail.redis), settings.failure)
    return Recorder(trail, tracker, tuning or DEFAULT_TUNING, registry=registry)


def run_recording_process(frames: BinaryIO, reports: BinaryIO) -> bool:
    """The recording process (``exa bridge recorder``): the hello frame's settings, then ``serve`` until EOF.

    Returns False when records were left unwritten.
    """
    from examlops.monitoring.recorder_process import ignore_stop_signals, lower_priority, read_hello, serve

    ignore_stop_signals()
    hello = read_hello(frames)
    if hello is None:
        return True  # the bridge went away before saying anything
    settings = Settings.model_validate_json(hello.config)
    with audit_trail(settings) as trail:
        recorder = redis_recorder(settings, trail, hello.tuning)
        lower_priority(hello.nice)
        return serve(recorder.start(), frames, reports)
