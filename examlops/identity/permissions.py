"""Permissions and the roles that bundle them.

``caller`` may call; ``operator`` may call, read traces and take every control action but managing
identities; ``bridge`` may call and relay (a bus bridge, which tells serving which verified identity a bus
call is for: ``X-Examlops-Identity``); ``admin`` may do everything. An identity's own task and model lists
narrow ``call`` (``Caller.may_call``); they never widen a role.
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
    READ_TRACES = "read_traces"
    """Read the trace of every call (`GET /v1/traces`): who called what, and inputs under the payload policy."""
    RELAY = "relay"
    """Serving takes the identity a call names in ``X-Examlops-Identity`` as the one it is for (its trace
    records that identity); only a bridge, which verified that identity's signed job, should hold it."""


class Role(StrEnum):
    CALLER = "caller"
    OPERATOR = "operator"
    ADMIN = "admin"
    BRIDGE = "bridge"


ROLE_PERMISSIONS: dict[Role, frozenset[Permission]] = {
    Role.CALLER: frozenset({Permission.CALL}),
    Role.OPERATOR: frozenset(set(Permission) - {Permission.MANAGE_IDENTITIES, Permission.RELAY}),
    Role.BRIDGE: frozenset({Permission.CALL, Permission.RELAY}),
    Role.ADMIN: frozenset(Permission),
}


def parse_role(text: str) -> Role:
    """The role ``text`` names (any case); ``ValueError`` naming the roles there are."""
    try:
        return Role(text.strip().lower())
    except ValueError:
        raise ValueError(f"unknown role {text[:32]!r}: one of {', '.join(r.value for r in Role)}") from None
