"""The audit trail of control actions, for serving, the flows and the CLI."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine

from examlops.bootstrap.sql import sql_engine
from examlops.core.settings import Settings

if TYPE_CHECKING:
    from examlops.monitoring.audit import AuditTrail


def control_events(settings: Settings, engine: Engine) -> Callable[[str, str, Mapping[str, Any]], None]:
    """Appends control actions (traffic changes, reloads, refusals) to the audit trail, signing each one.

    Control actions are rare and each is checkpointed at once, so a serving process that stops never
    leaves unsigned events of its own behind. Redis is reached on first use.
    """
    from examlops.adapters.redis import connect
    from examlops.monitoring.audit import AuditTrail
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
    from examlops.adapters.redis import connect
    from examlops.monitoring.audit import AuditTrail
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
