"""Permissions and the roles that bundle them.

``caller`` may call; ``operator`` may call and take every control action but managing identities;
``admin`` may do everything. An identity's own task and model lists narrow ``call`` (``Caller.may_call``);
they never widen a role.
"""

from __future__ import annotations

from enum import StrEnum


class Permission(StrEnum):
    CALL = "call"
    SET_TRAFFIC = "set_traffic"
    RELOAD = "reload"
    PROMOTE = "promote"
    ROLLBACK = "rollback"
    RETRAIN = "retrain"
    MANAGE_IDENTITIES = "manage_identities"


class Role(StrEnum):
    CALLER = "caller"
    OPERATOR = "operator"
    ADMIN = "admin"


ROLE_PERMISSIONS: dict[Role, frozenset[Permission]] = {
    Role.CALLER: frozenset({Permission.CALL}),
    Role.OPERATOR: frozenset(set(Permission) - {Permission.MANAGE_IDENTITIES}),
    Role.ADMIN: frozenset(Permission),
}


def parse_role(text: str) -> Role:
    """The role ``text`` names (any case); ``ValueError`` naming the roles there are."""
    try:
        return Role(text.strip().lower())
    except ValueError:
        raise ValueError(f"unknown role {text[:32]!r}: one of {', '.join(r.value for r in Role)}") from None
