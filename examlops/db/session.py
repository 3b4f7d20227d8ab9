"""``store_session(engine, doing)``: a SQLModel session whose unreachable database is ``StoreUnavailable``;
``store_transaction(engine, doing)`` the same for a Core connection in one transaction (committed on leaving).

The one translation the SQL stores share: an ``OperationalError`` (refused, dropped, locked past the busy
wait) becomes ``StoreUnavailable`` naming what the store was doing, so callers retry or report one error of
ours; other SQL errors pass unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from examlops.core.errors import StoreUnavailable


@contextmanager
def store_session(engine: Engine, doing: str) -> Iterator[Session]:
    with _unavailable(doing), Session(engine) as session:
        yield session


@contextmanager
def store_transaction(engine: Engine, doing: str) -> Iterator[Connection]:
    """A Core connection in one transaction: committed on leaving, rolled back on any error; an
    ``OperationalError`` is ``StoreUnavailable`` naming ``doing``."""
    with _unavailable(doing), engine.begin() as connection:
        yield connection


@contextmanager
def _unavailable(doing: str) -> Iterator[None]:
    try:
        yield
    except OperationalError as exc:
        raise StoreUnavailable(f"cannot {doing}: {exc.orig}") from exc
