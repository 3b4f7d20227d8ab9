"""The SQL engine of every process: SQLite in the state folder unless a URL is set."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel, create_engine

from examlops.core.settings import Settings


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
    import examlops.monitoring.audit.checkpoints
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
