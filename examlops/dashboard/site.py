"""The plumbing every dashboard route shares: rendering a page, the session of a request, the login redirect.

``Site(sessions)`` renders templates with the prefix, refresh and UI links, resolves a request's session to a
``Caller`` (with authentication off a session is opened on the first visit and reads as ``SYSTEM_CALLER``,
but no action is offered and ``access.py`` refuses every one: read-only; a revoked or expired token closes
the session and sends the request to the login form, as a session that ended does, both saying it expired),
and ``shown`` renders a page for the caller from a
``Build``. A failing source never gets here: the views turn it into a problem
string. A page's background refreshes (htmx's, the charts' JSON) do not renew a session's idle deadline.
The sources are read from ``app.state`` on every request (``attach_sources``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from examlops.core.errors import ExamlopsError, Forbidden, InvalidInput, NotFound, Unauthenticated
from examlops.dashboard.ports import Authenticator, DashboardSources
from examlops.dashboard.sessions import COOKIE, Session, SessionStore
from examlops.dashboard.web import HEADERS, to_login
from examlops.identity import SYSTEM_CALLER, Caller

PREFIX = "/dashboard"
STATE_KEY = "dashboard_sources"
REFRESH_S = 5
"""Seconds between in-place refreshes of a page's figures."""
# The dashboard answers HTML, not the API's JSON errors, so it keeps its own short table (api/errors.py
# keeps the API's); anything else is a dependency's failure.
STATUS = ((Unauthenticated, 401), (Forbidden, 403), (InvalidInput, 400), (NotFound, 404))

Build = Callable[[Caller, DashboardSources], Awaitable[dict[str, Any]]]
"""What a page shows for a caller, gathered from the sources."""


def attach_sources(app: FastAPI, sources: DashboardSources) -> None:
    """What the composition root calls once it built the app: the dashboard reads these on every request."""
    setattr(app.state, STATE_KEY, sources)


def sources_of(request: Request) -> DashboardSources:
    found = getattr(request.app.state, STATE_KEY, None)
    return found if isinstance(found, DashboardSources) else DashboardSources()


def status_of(error: ExamlopsError) -> int:
    return next((status for kind, status in STATUS if isinstance(error, kind)), 502)


def threaded(gather: Callable[[Caller, DashboardSources], dict[str, Any]]) -> Build:
    """A blocking view function (SQL, Redis) run off the event loop."""

    async def build(caller: Caller, sources: DashboardSources) -> dict[str, Any]:
        return await asyncio.to_thread(gather, caller, sources)

    return build


class Redirect(Exception):
    def __init__(self, to: str) -> None:
        self.to = to


class Site:
    def __init__(self, sessions: SessionStore) -> None:
        self.sessions = sessions
        self.env = Environment(loader=PackageLoader("examlops.dashboard", "templates"), autoescape=select_autoescape())

    def page(self, request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = self.env.get_template(template).render(
            prefix=PREFIX, refresh_s=REFRESH_S, links=sources_of(request).links, path=request.url.path, **context
        )
        return HTMLResponse(html, status_code=status, headers=HEADERS)

    async def session_of(self, request: Request) -> tuple[Caller, Session, str | None]:
        """The caller and session of a request, and a new session id to set when one was opened; ``Redirect``
        to the login form without a live session."""
        identities: Authenticator | None = request.app.state.identities
        background = request.headers.get("HX-Request") == "true" or request.url.path.endswith(".json")
        cookie = request.cookies.get(COOKIE)
        session = self.sessions.get(cookie, renew=not background)
        if identities is None:
            if session is not None:
                return SYSTEM_CALLER, session, None
            session_id, session = self.sessions.open(None)
            return SYSTEM_CALLER, session, session_id
        if session is None:  # a cookie without a live session: it ended (idle, 12 h after login, a restart)
            raise Redirect(f"{PREFIX}/login?expired=1" if cookie else f"{PREFIX}/login")
        try:
            caller = await asyncio.to_thread(identities.authenticate, session.token)
        except Unauthenticated:
            self.sessions.close(request.cookies.get(COOKIE))
            raise Redirect(f"{PREFIX}/login?expired=1") from None
        return caller, session, None

    @staticmethod
    def with_cookie(response: Response, session_id: str | None, *, secure: bool = False) -> Response:
        if session_id is not None:
            response.set_cookie(COOKIE, session_id, httponly=True, samesite="strict", path=PREFIX,
                                secure=secure)  # fmt: skip
        return response

    async def shown(self, request: Request, template: str, build: Build) -> Response:
        try:
            caller, session, new = await self.session_of(request)
        except Redirect as redirect:
            return to_login(request, redirect.to)
        context = await build(caller, sources_of(request))
        auth = request.app.state.identities is not None
        if not auth and "may" in context:  # without identities the dashboard is read-only: no action offered
            context["may"] = dict.fromkeys(context["may"], False)
        response = self.page(request, template, caller=caller.name, csrf=session.csrf, auth=auth,
                             **context)  # fmt: skip
        return self.with_cookie(response, new, secure=request.url.scheme == "https")

    def refused(self, request: Request, caller: Caller, session: Session, status: int, message: str) -> Response:
        return self.page(request, "result.html", status=status, caller=caller.name, csrf=session.csrf,
                         auth=request.app.state.identities is not None, ok=False, message=message)  # fmt: skip
