"""The values of an identity: the identity, one of its keys, and the ``Caller`` a request acts as.

Names of tasks and models are compared case-insensitively, as the catalog does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from examlops.core.errors import Forbidden
from examlops.identity.permissions import ROLE_PERMISSIONS, Permission, Role


@dataclass(frozen=True, slots=True)
class Identity:
    """A named caller. Empty ``tasks``/``models`` mean every task/model; ``revoked`` is when it was revoked."""

    name: str
    role: Role
    tasks: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    created: datetime | None = None
    revoked: datetime | None = None

    @property
    def permissions(self) -> frozenset[Permission]:
        return ROLE_PERMISSIONS[self.role]


@dataclass(frozen=True, slots=True)
class IdentityKey:
    """One key of an identity: only the secret's sha256 is kept, with the bus key derived from the secret.

    ``not_after`` is set when the key was rotated out (valid until then) or revoked (the revocation time).
    """

    key_id: str
    identity: str
    secret_sha256: str
    bus_key: bytes
    created: datetime
    not_after: datetime | None = None

    def valid_at(self, now: datetime) -> bool:
        return self.not_after is None or now < self.not_after


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request acts as, and what it may do: ``require`` and ``may_call`` raise ``Forbidden`` naming the
    permission, never return False. ``key_id`` is the key the request presented (never the secret);
    ``revoked``: the identity was revoked or the key expired (the bus answers such a job ``unauthenticated``;
    HTTP never builds a revoked caller)."""

    identity: Identity
    key_id: str = ""
    revoked: bool = False
    _tasks: frozenset[str] = field(init=False, repr=False)
    _models: frozenset[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_tasks", frozenset(t.lower() for t in self.identity.tasks))
        object.__setattr__(self, "_models", frozenset(m.lower() for m in self.identity.models))

    @property
    def name(self) -> str:
        return self.identity.name

    def has(self, permission: Permission) -> bool:
        return permission in self.identity.permissions

    def require(self, permission: Permission) -> None:
        if not self.has(permission):
            raise Forbidden(
                f"identity {self.name!r} ({self.identity.role.value}) lacks the permission {permission.value!r}",
                permission=permission.value,
            )

    def may_call(self, *, task: str | None = None, model: str | None = None) -> None:
        """``call`` on ``task`` and ``model``: the role must give ``call`` and each named one be in the lists.

        An identity with a task list and no model list calls by task only: naming a model directly (a model
        route, a model's bus address) would step around the tasks it was narrowed to.
        """
        self.require(Permission.CALL)
        if task is None and model is not None and self._tasks and not self._models:
            raise Forbidden(f"identity {self.name!r} may call its tasks only, not a model by name", permission="call")
        if task is not None and self._tasks and task.lower() not in self._tasks:
            raise Forbidden(
                f"identity {self.name!r} lacks the permission 'call' on task {task[:64]!r}", permission="call"
            )
        if model is not None and self._models and model.lower() not in self._models:
            raise Forbidden(
                f"identity {self.name!r} lacks the permission 'call' on model {model[:64]!r}", permission="call"
            )


SYSTEM_CALLER = Caller(Identity(name="system:auth-off", role=Role.ADMIN))
"""The caller of every request when authentication is off (development only)."""
