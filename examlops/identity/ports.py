"""The identity store port: identities and their keys, kept by the SQL adapter (``identity.sql``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from examlops.identity.model import Identity, IdentityKey


class IdentityStore(Protocol):
    """Identities and keys. Every method raises ``StoreUnavailable`` when the store cannot be reached."""

    def add(self, identity: Identity, key: IdentityKey) -> None:
        """Store a new identity with its first key; ``Conflict`` when the name is taken."""
        ...

    def get(self, name: str) -> Identity | None: ...

    def identities(self) -> Sequence[Identity]:
        """Every identity, revoked ones too, by name."""
        ...

    def keys(self, name: str) -> Sequence[IdentityKey]:
        """The identity's keys, oldest first."""
        ...

    def key(self, key_id: str) -> tuple[Identity, IdentityKey] | None:
        """The key and its identity, or None for an unknown key id."""
        ...

    def add_key(self, key: IdentityKey, *, retire_others_at: datetime) -> None:
        """Add a key to its identity and end every other key still open (``not_after`` None or later) at
        ``retire_others_at``."""
        ...

    def revoke(self, name: str, at: datetime) -> None:
        """Mark the identity revoked and end every key at ``at``; ``NotFound`` for an unknown name."""
        ...
