"""SQL engines from a URL: SQLite with WAL and a 30 s busy wait, Postgres through psycopg 3.

``create_sql_engine(url)`` connects to nothing until first use. A ``postgresql://`` URL with no driver
means psycopg 3 (``postgresql+psycopg://``), the driver examlops installs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import URL, event, make_url
from sqlalchemy.engine import Engine
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlmodel import create_engine

from examlops.core.errors import ConfigError

EXAMPLE = "postgresql://user:password@host:5432/examlops"


def normalize_url(url: str) -> URL:
    """The URL with psycopg 3 as the Postgres driver when none is named; ``ConfigError`` naming the setting
    for one SQLAlchemy cannot parse."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(f"EXAMLOPS_DATABASE_URL is not a database URL (such as {EXAMPLE})") from None
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def redacted(url: str) -> str:
    """The URL as it may be printed: the password hidden."""
    return normalize_url(url).render_as_string(hide_password=True)


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite URL; ``None`` for an in-memory database or another backend."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def create_sql_engine(url: str, **kwargs: Any) -> Engine:
    """The engine for ``url``; SQLite's folder is created, its journal is WAL (readers never wait on a writer).
    ``ConfigError`` naming the setting for a URL of a database or driver SQLAlchemy does not have."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() != "sqlite":
        try:
            return create_engine(parsed, pool_pre_ping=True, **kwargs)
        except NoSuchModuleError as exc:
            raise ConfigError(
                f"EXAMLOPS_DATABASE_URL names a database examlops cannot use ({parsed.drivername}): "
                f"SQLite or PostgreSQL, such as {EXAMPLE}"
            ) from exc
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"EXAMLOPS_DATABASE_URL ({parsed.drivername}) needs the Python module {exc.name or exc}, which is not "
                f"installed; examlops installs psycopg for PostgreSQL, such as {EXAMPLE}"
            ) from exc
    path = sqlite_file(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(parsed, connect_args={"check_same_thread": False, "timeout": 30}, **kwargs)

    @event.listens_for(engine, "connect")
    def _wal(dbapi_connection: Any, _record: object) -> None:
        # WAL lets serving read rules while a CLI writes them.
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    return engine
