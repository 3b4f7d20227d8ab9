"""Managing identities: add, list, revoke, rotate, and the first admin of `exa up`.

Tokens are returned once (``IssuedToken.token``) and never stored. ``rotate`` adds a key and ends every
other open key of the identity ``grace_s`` seconds later, so a caller can switch tokens without a gap.
Bad input (a name that is not one, an unknown role) is ``InvalidInput``; a taken name ``Conflict``; an
unknown name ``NotFound``; rotating a revoked identity ``Conflict``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from examlops.core.errors import Conflict, InvalidInput, NotFound
from examlops.identity.model import Identity, IdentityKey
from examlops.identity.permissions import Role
from examlops.identity.ports import IdentityStore
from examlops.identity.tokens import IssuedToken, new_token

ADMIN_NAME = "admin"
BRIDGE_NAME = "bridge"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _key(identity: str, issued: IssuedToken, created: datetime) -> IdentityKey:
    return IdentityKey(issued.key_id, identity, issued.secret_sha256, issued.bus_key, created)


class IdentityService:
    def __init__(self, store: IdentityStore, *, wall: Callable[[], datetime] = _utc_now) -> None:
        self.store = store
        self._wall = wall

    def add(
        self, name: str, role: Role, *, tasks: Sequence[str] = (), models: Sequence[str] = ()
    ) -> tuple[Identity, IssuedToken]:
        if not _NAME.fullmatch(name):
            raise InvalidInput(
                "an identity name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
                field="name",
            )
        now = self._wall()
        identity = Identity(
            name=name,
            role=role,
            tasks=tuple(dict.fromkeys(t.strip() for t in tasks if t.strip())),
            models=tuple(dict.fromkeys(m.strip() for m in models if m.strip())),
            created=now,
        )
        issued = new_token()
        self.store.add(identity, _key(name, issued, now))
        return identity, issued

    def identities(self) -> list[tuple[Identity, Sequence[IdentityKey]]]:
        return [(identity, self.store.keys(identity.name)) for identity in self.store.identities()]

    def revoke(self, name: str) -> Identity:
        identity = self._existing(name)
        if identity.revoked is None:
            self.store.revoke(name, self._wall())
        return self._existing(name)

    def rotate(self, name: str, grace_s: float) -> tuple[IssuedToken, datetime]:
        """A new token for ``name``; the old keys stay valid until the returned deadline."""
        if grace_s < 0:
            raise InvalidInput("the grace period cannot be negative", field="grace")
        identity = self._existing(name)
        if identity.revoked is not None:
            raise Conflict(f"identity {name!r} is revoked: add a new identity instead")
        now = self._wall()
        deadline = now + timedelta(seconds=grace_s)
        issued = new_token()
        self.store.add_key(_key(name, issued, now), retire_others_at=deadline)
        return issued, deadline

    def ensure_admin(self) -> IssuedToken | None:
        """Create the ``admin`` identity if there is none; its token, or None when it exists already."""
        return self._ensure(ADMIN_NAME, Role.ADMIN)

    def ensure_bridge(self) -> IssuedToken | None:
        """Create the ``bridge`` identity (role bridge: call and relay) if there is none; as ``ensure_admin``."""
        return self._ensure(BRIDGE_NAME, Role.BRIDGE)

    def _ensure(self, name: str, role: Role) -> IssuedToken | None:
        if self.store.get(name) is not None:
            return None
        return self.add(name, role)[1]

    def _existing(self, name: str) -> Identity:
        identity = self.store.get(name)
        if identity is None:
            raise NotFound(f"no identity named {name[:64]!r}")
        return identity
