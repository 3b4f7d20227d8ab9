"""An in-memory ``IdentityStore`` that counts its reads, so tests can see the resolver's cache at work."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from examlops.core.errors import Conflict, NotFound
from examlops.identity import Identity, IdentityKey


@dataclass
class InMemoryIdentityStore:
    identities_by_name: dict[str, Identity] = field(default_factory=dict)
    keys_by_id: dict[str, IdentityKey] = field(default_factory=dict)
    key_reads: int = 0

    def add(self, identity: Identity, key: IdentityKey) -> None:
        if identity.name in self.identities_by_name:
            raise Conflict(f"an identity named {identity.name!r} exists already")
        self.identities_by_name[identity.name] = identity
        self.keys_by_id[key.key_id] = key

    def get(self, name: str) -> Identity | None:
        return self.identities_by_name.get(name)

    def identities(self) -> Sequence[Identity]:
        return [self.identities_by_name[name] for name in sorted(self.identities_by_name)]

    def keys(self, name: str) -> Sequence[IdentityKey]:
        return sorted((k for k in self.keys_by_id.values() if k.identity == name), key=lambda k: k.created)

    def key(self, key_id: str) -> tuple[Identity, IdentityKey] | None:
        self.key_reads += 1
        key = self.keys_by_id.get(key_id)
        return None if key is None else (self.identities_by_name[key.identity], key)

    def add_key(self, key: IdentityKey, *, retire_others_at: datetime) -> None:
        for other in self.keys(key.identity):
            if other.not_after is None or other.not_after > retire_others_at:
                self.keys_by_id[other.key_id] = replace(other, not_after=retire_others_at)
        self.keys_by_id[key.key_id] = key

    def revoke(self, name: str, at: datetime) -> None:
        if name not in self.identities_by_name:
            raise NotFound(f"no identity named {name!r}")
        self.identities_by_name[name] = replace(self.identities_by_name[name], revoked=at)
        for key in self.keys(name):
            if key.not_after is None or key.not_after > at:
                self.keys_by_id[key.key_id] = replace(key, not_after=at)
