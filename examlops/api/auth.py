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
from typing import Annotated, Any, Protocol

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from examlops.api.tracing import adopt_bridge_claims, call_of, relayed_identity
from examlops.identity import SYSTEM_CALLER, Caller, Permission

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="examlops token",
    description="`Authorization: Bearer exa_<key id>_<secret>`: a token from `exa identity add` (or the "
    "state folder's admin.token after `exa up`).",
)


class Authenticator(Protocol):
    """What the HTTP side needs of ``examlops.identity.IdentityResolver``."""

    def cached(self, token: str | None) -> Caller | None: ...

    def is_fresh(self, token: str | None) -> bool: ...

    def authenticate(self, token: str | None) -> Caller: ...


async def current_caller(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]
) -> Caller:
    """The request's caller; an inference call's trace names the identity it acts for (``acting_identity``)."""
    return await caller_of(request, credentials.credentials if credentials is not None else None)


async def request_caller(request: Request) -> Caller:
    """``current_caller`` for the hot inference routes, called in the route's body: the same header rules as
    ``HTTPBearer(auto_error=False)`` (``Bearer`` in any case, else no token) without FastAPI's dependency
    solving (its cost: ``bench/RESULTS.md``). Those routes declare the scheme in their OpenAPI with
    ``SECURED``."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return await caller_of(request, token.strip() or None if scheme.lower() == "bearer" else None)


SECURED: dict[str, Any] = {"security": [{bearer.scheme_name: []}]}
"""``openapi_extra`` of a route that authenticates with ``request_caller``: the docs show the scheme."""


async def caller_of(request: Request, token: str | None) -> Caller:
    """The caller ``token`` resolves to (``Unauthenticated`` else; ``SYSTEM_CALLER`` with authentication
    off), noted on the request's trace."""
    identities: Authenticator | None = request.app.state.identities
    if identities is None:
        caller = SYSTEM_CALLER
    elif (known := identities.cached(token)) is not None:
        caller = known
    elif identities.is_fresh(token):
        caller = identities.authenticate(token)
    else:  # a cache miss reads SQL: off the event loop
        caller = await asyncio.to_thread(identities.authenticate, token)
    call = call_of(request)
    if call is not None:
        if caller.has(Permission.RELAY):
            adopt_bridge_claims(call, request.scope)
        call.identity = acting_identity(request, caller)
    return caller


def acting_identity(request: Request, caller: Caller) -> str:
    """The identity a call is for, as its trace names it: the one a bridge relays (``X-Examlops-Identity``)
    when the caller holds ``relay``, else the caller's own. A relayed name from any other caller is ignored."""
    if caller.has(Permission.RELAY):
        relayed = relayed_identity(request.scope)
        if relayed is not None:
            return relayed
    return caller.name


CurrentCaller = Annotated[Caller, Depends(current_caller)]
"""The parameter type of a route that needs a caller."""
