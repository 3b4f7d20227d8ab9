"""Identities, their tokens and permissions (issue 16): who a call or control action acts as.

See README.md in this folder for the contracts.
"""

from examlops.identity.model import SYSTEM_CALLER, Caller, Identity, IdentityKey
from examlops.identity.permissions import ROLE_PERMISSIONS, Permission, Role, parse_role
from examlops.identity.ports import IdentityStore
from examlops.identity.resolver import IdentityResolver
from examlops.identity.service import ADMIN_NAME, IdentityService
from examlops.identity.tokens import IssuedToken, bus_key_from_token, parse_token

__all__ = [
    "ADMIN_NAME",
    "ROLE_PERMISSIONS",
    "SYSTEM_CALLER",
    "Caller",
    "Identity",
    "IdentityKey",
    "IdentityResolver",
    "IdentityService",
    "IdentityStore",
    "IssuedToken",
    "Permission",
    "Role",
    "bus_key_from_token",
    "parse_role",
    "parse_token",
]
