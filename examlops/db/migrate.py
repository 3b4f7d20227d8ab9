"""``upgrade(url)``: bring a database to the newest revision, once, however many processes ask at once.

Contract:

- The whole upgrade runs in one transaction under one lock: ``pg_advisory_xact_lock`` on Postgres,
  ``BEGIN IMMEDIATE`` (the database's write lock, waited on for up to 30 s) on SQLite. A second process
  waits, then finds the work done and changes nothing. DDL is transactional on both, so a failed upgrade
  leaves the database as it was.
- A database made by ``create_all`` before migrations existed (every table of the first revision, no
  ``alembic_version``) is adopted: stamped at the first revision, then upgraded.
- A database at a revision this release does not know, or with only some of the first revision's tables,
  is refused with ``SchemaNotCurrent``; an unreachable one is ``StoreUnavailable``. A statement that
  fails rolls the whole upgrade back: ``StoreUnavailable`` for an operational error (SQLite reports
  most of its errors so), else ``SchemaNotCurrent``; both carry the database's message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, event, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.pool import NullPool

from examlops.core.errors import SchemaNotCurrent, StoreUnavailable
from examlops.db.engine import create_sql_engine, redacted
from examlops.db.state import FIRST_REVISION, SchemaState, alembic_config, read_state

LOCK_KEY = int.from_bytes(b"examlops", "big")
"""The Postgres advisory lock every examlops upgrade takes (a bigint)."""


@dataclass(frozen=True, slots=True)
class Upgrade:
    before: SchemaState
    after: SchemaState

    @property
    def adopted(self) -> bool:
        """The database was made before migrations and has been stamped at the first revision."""
        return self.before.status == "unversioned"

    def as_dict(self) -> dict[str, Any]:
        return {"before": self.before.as_dict(), "after": self.after.as_dict(), "adopted": self.adopted}


def _migration_engine(url: str) -> Engine:
    engine = create_sql_engine(url, poolclass=NullPool)
    if engine.dialect.name == "sqlite":
        # pysqlite opens transactions itself, and not before DDL: take that over, so the upgrade is one
        # transaction that starts by taking the write lock (SQLAlchemy's documented pysqlite recipe).
        @event.listens_for(engine, "connect")
        def _no_driver_transactions(dbapi_connection: Any, _record: object) -> None:
            dbapi_connection.isolation_level = None

        @event.listens_for(engine, "begin")
        def _begin_immediate(connection: Connection) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def upgrade(url: str) -> Upgrade:
    """Upgrade the database at ``url`` to the newest revision; see the module's contract."""
    from alembic import command

    engine = _migration_engine(url)
    try:
        with engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK_KEY})
            before = read_state(connection, url)
            if before.status in ("unknown", "partial"):
                raise SchemaNotCurrent(before.problem())
            if before.status != "current":
                config = alembic_config(connection)
                if before.status == "unversioned":
                    command.stamp(config, FIRST_REVISION)
                command.upgrade(config, "head")
            return Upgrade(before, read_state(connection, url))
    except OperationalError as exc:  # the database cannot be reached, or (SQLite) refused a statement
        raise StoreUnavailable(_failed(url, exc)) from exc
    except DBAPIError as exc:
        raise SchemaNotCurrent(_failed(url, exc)) from exc
    finally:
        engine.dispose()


def _failed(url: str, exc: DBAPIError) -> str:
    return f"the SQL schema upgrade at {redacted(url)} failed, nothing changed: {exc.orig}"
