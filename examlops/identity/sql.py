"""Identities in SQL (SQLModel): the adapter behind the ``IdentityStore`` port.

``identity`` has one row per name (its role, task and model lists as JSON, created and revoked times);
``identity_key`` one row per key: the sha256 of the token's secret (the secret itself is never stored),
the bus key derived from the secret, and ``not_after``.

The trade-off of ``bus_key``: the bridge verifies a bus job's HMAC with the identity's bus key, and a hash
of the secret cannot give it back, so the key is stored. Whoever reads this table can therefore sign bus
jobs as any identity, but cannot present an HTTP token (that needs the secret, of which only a hash is
here). Guard read access to the database as you guard the platform secret.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime

from sqlalchemy import DateTime
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel, select

from examlops.core.errors import Conflict, NotFound
from examlops.db.session import store_session
from examlops.identity.model import Identity, IdentityKey
from examlops.identity.permissions import Role


class IdentityRow(SQLModel, table=True):
    __tablename__ = "identity"

    name: str = Field(primary_key=True)
    role: str
    tasks: str
    """JSON list; empty means every task."""
    models: str
    """JSON list; empty means every model."""
    created: datetime = Field(sa_type=DateTime(timezone=True))
    revoked: datetime | None = Field(default=None, sa_type=DateTime(timezone=True))


class IdentityKeyRow(SQLModel, table=True):
    __tablename__ = "identity_key"

    key_id: str = Field(primary_key=True)
    identity: str = Field(foreign_key="identity.name", index=True)
    secret_sha256: str
    bus_key: str
    """Hex of HMAC-SHA256(secret, b"examlops-bus-v1") (module docstring: why it is stored)."""
    created: datetime = Field(sa_type=DateTime(timezone=True))
    not_after: datetime | None = Field(default=None, sa_type=DateTime(timezone=True))


def _aware(moment: datetime | None) -> datetime | None:
    """SQLite gives naive datetimes back: every time we store is UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def _identity(row: IdentityRow) -> Identity:
    return Identity(
        name=row.name,
        role=Role(row.role),
        tasks=tuple(json.loads(row.tasks)),
        models=tuple(json.loads(row.models)),
        created=_aware(row.created),
        revoked=_aware(row.revoked),
    )


def _key(row: IdentityKeyRow) -> IdentityKey:
    created = _aware(row.created)
    assert created is not None
    return IdentityKey(
        key_id=row.key_id,
        identity=row.identity,
        secret_sha256=row.secret_sha256,
        bus_key=bytes.fromhex(row.bus_key),
        created=created,
        not_after=_aware(row.not_after),
    )


class SqlIdentityStore:
    """``IdentityStore`` on a SQL engine (contracts on the port)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def _session(self, doing: str) -> AbstractContextManager[Session]:
        return store_session(self._engine, doing)

    def add(self, identity: Identity, key: IdentityKey) -> None:
        try:
            with self._session("add an identity") as session:
                session.add(
                    IdentityRow(
                        name=identity.name,
                        role=identity.role.value,
                        tasks=json.dumps(list(identity.tasks)),
                        models=json.dumps(list(identity.models)),
                        created=identity.created or key.created,
                        revoked=None,
                    )
                )
                session.flush()
                session.add(self._key_row(key))
                session.commit()
        except IntegrityError as exc:
            raise Conflict(f"an identity named {identity.name!r} exists already") from exc

    def get(self, name: str) -> Identity | None:
        with self._session("read an identity") as session:
            row = session.get(IdentityRow, name)
            return None if row is None else _identity(row)

    def identities(self) -> Sequence[Identity]:
        with self._session("list identities") as session:
            rows = session.exec(select(IdentityRow).order_by(IdentityRow.name)).all()
            return [_identity(row) for row in rows]

    def keys(self, name: str) -> Sequence[IdentityKey]:
        with self._session("list keys") as session:
            rows = session.exec(
                select(IdentityKeyRow).where(IdentityKeyRow.identity == name).order_by(IdentityKeyRow.created)  # type: ignore[arg-type]  # SQLModel column typing
            ).all()
            return [_key(row) for row in rows]

    def key(self, key_id: str) -> tuple[Identity, IdentityKey] | None:
        with self._session("read a key") as session:
            key = session.get(IdentityKeyRow, key_id)
            if key is None:
                return None
            identity = session.get(IdentityRow, key.identity)
            return None if identity is None else (_identity(identity), _key(key))

    def add_key(self, key: IdentityKey, *, retire_others_at: datetime) -> None:
        with self._session("add a key") as session:
            for row in session.exec(select(IdentityKeyRow).where(IdentityKeyRow.identity == key.identity)).all():
                ends = _aware(row.not_after)
                if ends is None or ends > retire_others_at:
                    row.not_after = retire_others_at
                    session.add(row)
            session.add(self._key_row(key))
            session.commit()

    def revoke(self, name: str, at: datetime) -> None:
        with self._session("revoke an identity") as session:
            identity = session.get(IdentityRow, name)
            if identity is None:
                raise NotFound(f"no identity named {name!r}")
            identity.revoked = at
            session.add(identity)
            for row in session.exec(select(IdentityKeyRow).where(IdentityKeyRow.identity == name)).all():
                ends = _aware(row.not_after)
                if ends is None or ends > at:
                    row.not_after = at
                    session.add(row)
            session.commit()

    @staticmethod
    def _key_row(key: IdentityKey) -> IdentityKeyRow:
        return IdentityKeyRow(
            key_id=key.key_id,
            identity=key.identity,
            secret_sha256=key.secret_sha256,
            bus_key=key.bus_key.hex(),
            created=key.created,
            not_after=key.not_after,
        )
