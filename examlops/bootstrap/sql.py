"""The SQL engine of every process, and the one list of the modules that define SQL tables.

``sql_engine(settings)`` creates no table: it raises ``SchemaNotCurrent`` (naming `exa db upgrade`) when
the database is not at the newest migration, ``StoreUnavailable`` when it cannot be reached. The schema
is created and upgraded only by ``upgrade_database`` (`exa db upgrade`, `exa up`): ``examlops.db``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from sqlalchemy import MetaData
from sqlalchemy.engine import Engine

from examlops.core.settings import Settings
from examlops.db import SchemaState, Upgrade, create_sql_engine, new_revision, require_current, schema_state, upgrade


def table_metadata() -> MetaData:
    """Every SQL table's model, loaded: a module that adds a table is imported here (and gets a migration)."""
    from sqlmodel import SQLModel

    import examlops.identity.sql
    import examlops.jobs.sql
    import examlops.loop.sql
    import examlops.monitoring.audit.checkpoints
    import examlops.monitoring.drift_store
    import examlops.serving.traffic_store
    import examlops.tasks.sql
    import examlops.tracing.sql_store  # noqa: F401

    return SQLModel.metadata


def sql_engine(settings: Settings) -> Engine:
    """The engine on the settings' database, once its schema is at the newest revision."""
    engine = create_sql_engine(settings.sql_url)
    try:
        require_current(engine, settings.sql_url)
    except BaseException:
        engine.dispose()
        raise
    return engine


def upgrade_database(settings: Settings) -> Upgrade:
    """Create or upgrade the settings' database to the newest revision (``examlops.db.upgrade``)."""
    return upgrade(settings.sql_url)


def database_state(settings: Settings) -> SchemaState:
    engine = create_sql_engine(settings.sql_url)
    try:
        return schema_state(engine, settings.sql_url)
    finally:
        engine.dispose()


def write_migration(settings: Settings, message: str) -> Path | None:
    """Write the next migration for what the models add to the newest revision; ``None`` when nothing."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=settings.state_dir, prefix="migration-") as scratch:
        return new_revision(table_metadata(), message, Path(scratch))
