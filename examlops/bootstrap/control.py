"""The control plane's adapters (for the flows and their CLI twins) and the audit trail's.

``ControlPlane(settings)`` builds each adapter on first use: the catalog, the MLflow registry, the snapshot
stream and reader, the drift store, the training references and the audit hook; ``audit_moves`` the audited
trail of a promotion (``bootstrap.moves``). ``audit_trail`` is the
appender; ``audit_access`` what reads, verifies and archives the trail (`exa audit`, the retention flow);
``failure_store`` the shared failure windows that `exa bridge status` reads.
No Prefect import: `exa drift report` and `exa retrain` run the same services in process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine

from examlops.bootstrap.sql import sql_engine
from examlops.core.settings import Settings

if TYPE_CHECKING:
    import redis

    from examlops.bootstrap.moves import AuditedMoves
    from examlops.monitoring.audit.archive import Archiver
    from examlops.monitoring.audit.checkpoints import SqlCheckpointStore
    from examlops.monitoring.audit.trail import AuditTrail
    from examlops.monitoring.drift_reference import TrainingReference
    from examlops.monitoring.drift_store import SqlDriftStore
    from examlops.monitoring.failure_store import RedisFailureStore
    from examlops.monitoring.snapshot_projection import ProjectedSnapshotReader
    from examlops.monitoring.snapshots import SnapshotStream
    from examlops.registry.catalog import Catalog
    from examlops.registry.mlflow_registry import MlflowRegistry

AuditHook = Callable[[str, str, Mapping[str, Any]], None]
"""``(event type, subject, data)``: appends one event to the audit trail; raises ``StoreUnavailable``."""


def audit_moves(audit: AuditHook, client: redis.Redis, actor: str, by: str = "promote flow") -> AuditedMoves:
    """The ``trail`` of a promotion or rollback (``bootstrap.moves``): intent, then outcome, each appended through
    ``audit`` and naming ``actor``; the per-alias index in ``client`` (``ControlPlane.redis``)."""
    from examlops.bootstrap.moves import AuditedMoves

    return AuditedMoves(audit, client, actor, by)


def control_events(settings: Settings, engine: Engine) -> AuditHook:
    """Appends control actions (traffic changes, reloads, refusals) to the audit trail, signing each one.

    Control actions are rare and each is checkpointed at once, so a serving process that stops never
    leaves unsigned events of its own behind. Redis is reached on first use.
    """
    from examlops.adapters.redis import connect
    from examlops.monitoring.audit.checkpoints import SqlCheckpointStore
    from examlops.monitoring.audit.trail import AuditTrail

    trail = AuditTrail(
        connect(settings.redis_url), settings.secret.get_secret_value().encode(), SqlCheckpointStore(engine)
    )

    def append(type: str, subject: str, data: Mapping[str, Any]) -> None:
        trail.append(type, subject, data)
        trail.checkpoint_now()

    return append


@contextmanager
def failure_store(settings: Settings) -> Iterator[RedisFailureStore]:
    """The shared failure windows, cooldowns and retrain records on the settings' Redis; closes it on exit."""
    from examlops.adapters.redis import connect
    from examlops.monitoring.failure_store import RedisFailureStore

    client = connect(settings.redis_url)
    try:
        yield RedisFailureStore(client)
    finally:
        client.close()


@contextmanager
def audit_trail(settings: Settings) -> Iterator[AuditTrail]:
    """The audit trail on the settings' Redis, with checkpoints in SQL; closes both on exit."""
    from examlops.adapters.redis import connect
    from examlops.monitoring.audit.checkpoints import SqlCheckpointStore
    from examlops.monitoring.audit.trail import AuditTrail

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


def audit_archive_dir(settings: Settings) -> Path:
    return settings.state_dir / "audit" / "archive"


class AuditAccess:
    """The audit trail as `exa audit` and the retention flow read it: the live chain and the archive; the
    checkpoints (SQL) and the archiver over them built on first use, so that `exa audit tail` needs Redis only."""

    def __init__(self, settings: Settings) -> None:
        from examlops.adapters.redis import connect
        from examlops.monitoring.audit.segments import ArchiveFiles
        from examlops.monitoring.audit.store import RedisAuditStore

        self.settings = settings
        self.store = RedisAuditStore(connect(settings.redis_url, socket_timeout_s=30.0))
        self.archive = ArchiveFiles(audit_archive_dir(settings))
        self.secret = settings.secret.get_secret_value().encode()
        self._engine: Engine | None = None

    @cached_property
    def checkpoints(self) -> SqlCheckpointStore:
        from examlops.monitoring.audit.checkpoints import SqlCheckpointStore

        self._engine = sql_engine(self.settings)
        return SqlCheckpointStore(self._engine)

    @cached_property
    def archiver(self) -> Archiver:
        from examlops.monitoring.audit.archive import Archiver

        return Archiver(self.store, self.checkpoints, self.secret, self.archive)

    def close(self) -> None:
        self.store.redis.close()
        if self._engine is not None:
            self._engine.dispose()


@contextmanager
def audit_access(settings: Settings) -> Iterator[AuditAccess]:
    """``AuditAccess`` on the settings' Redis and SQL, archiving under ``<state>/audit/archive``; closed on exit."""
    access = AuditAccess(settings)
    try:
        yield access
    finally:
        access.close()


@dataclass
class ControlPlane:
    """Adapters of one flow run or CLI command; each is built on first use."""

    settings: Settings

    @cached_property
    def catalog(self) -> Catalog:
        from examlops.bootstrap.serving import catalog

        return catalog(self.settings)

    @cached_property
    def registry(self) -> MlflowRegistry:
        from examlops.bootstrap.serving import model_registry

        return model_registry(self.settings)

    @cached_property
    def redis(self) -> redis.Redis:
        """A client on the settings' Redis for the control plane's own keys (the audited aliases)."""
        from examlops.adapters.redis import connect

        return connect(self.settings.redis_url)

    @cached_property
    def snapshot_stream(self) -> SnapshotStream:
        from examlops.adapters.redis import connect
        from examlops.monitoring.snapshots import SnapshotStream

        return SnapshotStream(connect(self.settings.redis_url, socket_timeout_s=30.0))

    @cached_property
    def snapshots(self) -> ProjectedSnapshotReader:
        from examlops.monitoring.snapshot_projection import ProjectedSnapshotReader

        return ProjectedSnapshotReader(self.snapshot_stream)

    @cached_property
    def drift_store(self) -> SqlDriftStore:
        from examlops.monitoring.drift_store import SqlDriftStore

        return SqlDriftStore(sql_engine(self.settings))

    @cached_property
    def references(self) -> TrainingReference:
        from examlops.monitoring.drift_reference import TrainingReference

        return TrainingReference(self.registry, self.catalog, self.drift_dir / "references")

    @property
    def drift_dir(self) -> Path:
        return self.settings.state_dir / "drift"

    @cached_property
    def audit(self) -> AuditHook:
        """Appends to the audit trail and signs each event at once: a flow's process is short-lived, so it
        leaves no unsigned event behind."""
        return control_events(self.settings, sql_engine(self.settings))
