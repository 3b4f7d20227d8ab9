"""Identities: the SQL store, the per-process resolver, the service behind `exa identity`, the admin token.

- ``identity_resolver(settings, engine)``: the TTL-cached resolver serving (and the bus bridge) use, its
  TTL ``settings.auth.cache_ttl_s``; None when authentication is off (development only).
- ``identity_service(settings)``: ``IdentityService`` on the settings' SQL, engine disposed on exit.
- ``provision_admin(settings)``: `exa up`'s first start: creates the ``admin`` identity when there is none
  and writes its token to ``settings.admin_token_path`` (created with mode 0600, never widened); the same
  for the ``bridge`` identity (role bridge) and ``settings.bridge_token_path``.
- ``bridge_token(settings)``: the token a bridge presents to serving: EXAMLOPS_BRIDGE_TOKEN, else the
  bridge token file, else the platform token.
- ``platform_token(settings)``: the token `exa` commands and the platform's own clients send:
  EXAMLOPS_TOKEN, else the admin token file, else None.
- ``acting_identity(settings)``: the name of the identity that token belongs to, for audit events of
  commands that work on SQL directly.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sqlalchemy.engine import Engine

from examlops.bootstrap.sql import sql_engine
from examlops.core.settings import Settings

if TYPE_CHECKING:
    from examlops.identity import Caller, IdentityResolver, IdentityService, Permission


def identity_resolver(settings: Settings, engine: Engine) -> IdentityResolver | None:
    from examlops.identity import IdentityResolver
    from examlops.identity.sql import SqlIdentityStore

    if not settings.auth.enabled:
        return None
    return IdentityResolver(SqlIdentityStore(engine), settings.auth.cache_ttl_s)


@contextmanager
def identity_service(settings: Settings) -> Iterator[IdentityService]:
    from examlops.identity import IdentityService
    from examlops.identity.sql import SqlIdentityStore

    engine = sql_engine(settings)
    try:
        yield IdentityService(SqlIdentityStore(engine))
    finally:
        engine.dispose()


def platform_token(settings: Settings) -> str | None:
    if settings.token is not None and settings.token.get_secret_value():
        return settings.token.get_secret_value()
    try:
        return settings.admin_token_path.read_text().strip() or None
    except OSError:
        return None


def write_token_file(path: os.PathLike[str] | str, token: str) -> None:
    """Write ``token`` to ``path`` readable by its owner only: created 0600 before a byte is written, then
    moved over any older file, so the token is never in a file others can read."""
    target = os.fspath(path)
    scratch = f"{target}.{os.getpid()}.tmp"
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (token + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(scratch, target)


def provision_admin(settings: Settings) -> bool:
    """Create the first ``admin`` identity and write its token file, and the ``bridge`` identity its bridges
    present to serving with its own; False when ``admin`` exists already (``bridge`` is made if missing)."""
    with identity_service(settings) as service:
        issued, bridge = service.ensure_admin(), service.ensure_bridge()
    if bridge is not None:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        write_token_file(settings.bridge_token_path, bridge.token)
    if issued is None:
        return False
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    write_token_file(settings.admin_token_path, issued.token)
    return True


def bridge_token(settings: Settings) -> str | None:
    """The token a bridge presents to serving: EXAMLOPS_BRIDGE_TOKEN, else the state folder's bridge token,
    else the platform token (``platform_token``), else None."""
    if settings.bridge_token is not None and settings.bridge_token.get_secret_value():
        return settings.bridge_token.get_secret_value()
    try:
        return settings.bridge_token_path.read_text().strip() or platform_token(settings)
    except OSError:
        return platform_token(settings)


def acting_caller(settings: Settings) -> Caller | None:
    """The caller the platform token resolves to (read now, no cache); None when there is no token.
    ``Unauthenticated`` when there is one and it is not valid."""
    from examlops.identity import IdentityResolver
    from examlops.identity.sql import SqlIdentityStore

    token = platform_token(settings)
    if token is None:
        return None
    engine = sql_engine(settings)
    try:
        return IdentityResolver(SqlIdentityStore(engine), 0.0).authenticate(token)
    finally:
        engine.dispose()


def acting_identity(settings: Settings, permission: Permission | None = None) -> str:
    """Who a command working on SQL or MLflow directly acts as, for its audit events: the platform token's
    identity, which must hold ``permission`` (``Forbidden`` otherwise; ``Unauthenticated`` for a token that is
    not valid). With no token at all, ``local:<os user>``: access to the database is then the only authority."""
    caller = acting_caller(settings)
    if caller is None:
        return f"local:{_os_user()}"
    if permission is not None:
        caller.require(permission)
    return caller.name


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        return "unknown"
