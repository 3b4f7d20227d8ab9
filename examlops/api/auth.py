"""Who a request acts as: the bearer-token dependency every route but /healthz, /readyz and /metrics takes.

``current_caller`` reads ``Authorization: Bearer <token>`` through FastAPI's ``HTTPBearer`` (so the OpenAPI
docs show the scheme) and resolves it with the app's ``Authenticator`` (``app.state.identities``). A missing,
malformed, unknown, revoked or expired token raises ``Unauthenticated`` (401, ``WWW-Authenticate: Bearer``,
one message for all); the routes then call ``Caller.require``/``may_call``, which raise ``Forbidden`` (403
naming the permission). Both happen before the pipeline is called, so a refused request is never served
and never counted as a model failure. With no authenticator (authentication off, development only) every
request acts as ``SYSTEM_CALLER``. The token is never logged or echoed.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Protocol

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from examlops.identity import SYSTEM_CALLER, Caller

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="examlops token",
    description="`Authorization: Bearer exa_<key id>_<secret>`: a token from `exa identity add` (or the "
    "state folder's admin.token after `exa up`).",
)


class Authenticator(Protocol):
    """What the HTTP side needs of ``examlops.identity.IdentityResolver``."""

    def is_fresh(self, token: str | None) -> bool: ...

    def authenticate(self, token: str | None) -> Caller: ...


async def current_caller(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]
) -> Caller:
    identities: Authenticator | None = request.app.state.identities
    if identities is None:
        return SYSTEM_CALLER
    token = credentials.credentials if credentials is not None else None
    if identities.is_fresh(token):
        return identities.authenticate(token)
    # A cache miss reads SQL: off the event loop.
    return await asyncio.to_thread(identities.authenticate, token)


CurrentCaller = Annotated[Caller, Depends(current_caller)]
"""The parameter type of a route that needs a caller."""
