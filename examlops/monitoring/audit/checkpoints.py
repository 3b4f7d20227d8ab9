"""Signed checkpoints of the audit chain, in SQL (SQLModel): the table, the signature and the store.

A checkpoint says "event ``seq`` had hash ``head_hash``", signed with
HMAC-SHA256 under ``settings.secret`` over the canonical JSON array
``["examlops.audit.checkpoint.v1", seq, head_hash]``. Because the chain lives in
Redis and the archive, and the checkpoints in SQL, rewriting a suffix with
recomputed hashes, truncating the tail or restoring an older copy all
contradict a checkpoint that the tamperer cannot re-sign. ``seq`` is the
primary key: every seq is checkpointed at most once, whichever appender writes
it first. Database errors become ``StoreUnavailable``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime
from typing import Protocol

from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlmodel import Field, Session, SQLModel, select

from examlops.core.errors import StoreUnavailable

CHECKPOINT_FORMAT = "examlops.audit.checkpoint.v1"


class AuditCheckpoint(SQLModel, table=True):
    seq: int = Field(primary_key=True)
    head_hash: str
    signed_at: datetime
    hmac: str


def sign_checkpoint(secret: bytes, seq: int, head_hash: str) -> str:
    message = json.dumps([CHECKPOINT_FORMAT, seq, head_hash], separators=(",", ":"), ensure_ascii=True)
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def checkpoint_is_genuine(secret: bytes, checkpoint: AuditCheckpoint) -> bool:
    return hmac.compare_digest(sign_checkpoint(secret, checkpoint.seq, checkpoint.head_hash), checkpoint.hmac)


class CheckpointStore(Protocol):
    def save(self, checkpoint: AuditCheckpoint) -> None:
        """Write one checkpoint; a checkpoint for a seq already written is ignored. ``StoreUnavailable``."""
        ...

    def all(self) -> list[AuditCheckpoint]:
        """Every checkpoint, by seq."""
        ...

    def newest(self, limit: int) -> list[AuditCheckpoint]:
        """The ``limit`` checkpoints of the highest seqs, highest first."""
        ...


class SqlCheckpointStore:
    """Checkpoints in the ``auditcheckpoint`` table; database errors become ``StoreUnavailable``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def save(self, checkpoint: AuditCheckpoint) -> None:
        row = AuditCheckpoint.model_validate(checkpoint.model_dump())
        try:
            with Session(self._engine) as session:
                session.add(row)
                session.commit()
        except IntegrityError:
            return  # another appender checkpointed this seq already
        except OperationalError as exc:
            raise StoreUnavailable(f"cannot write an audit checkpoint: {exc.orig}") from exc

    def all(self) -> list[AuditCheckpoint]:
        try:
            with Session(self._engine) as session:
                return list(session.exec(select(AuditCheckpoint).order_by(AuditCheckpoint.seq)).all())  # type: ignore[arg-type]  # SQLModel column typing
        except OperationalError as exc:
            raise StoreUnavailable(f"cannot read audit checkpoints: {exc.orig}") from exc

    def newest(self, limit: int) -> list[AuditCheckpoint]:
        query = select(AuditCheckpoint).order_by(AuditCheckpoint.seq.desc()).limit(limit)  # type: ignore[attr-defined]  # SQLModel column typing
        try:
            with Session(self._engine) as session:
                return list(session.exec(query).all())
        except OperationalError as exc:
            raise StoreUnavailable(f"cannot read audit checkpoints: {exc.orig}") from exc


def new_checkpoint(secret: bytes, seq: int, head_hash: str, now: float) -> AuditCheckpoint:
    return AuditCheckpoint(
        seq=seq,
        head_hash=head_hash,
        signed_at=datetime.fromtimestamp(now, UTC),
        hmac=sign_checkpoint(secret, seq, head_hash),
    )
