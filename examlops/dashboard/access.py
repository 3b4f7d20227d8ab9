"""The dashboard's routes that are not reading pages: its static assets, login and logout, and the operators'
actions (a confirmation page that changes nothing, then a POST carrying the session's CSRF token).

Contracts: with authentication off (no identities) the dashboard is read-only: the confirmation page and
every action are refused (403, ``READ_ONLY``). A login, logout or action whose ``Origin`` names another site
is refused (403); an action without the session's CSRF token or without its permission is refused (403)
before anything happens; an action goes through ``actions.perform``, the services and audit events the CLI
uses. A split the pipeline would refuse (``actions.check``) is refused (400) instead of a confirmation page,
so nothing is asked that could only fail. Each confirmation page carries a one-time token for its action: a
second POST of the same form is refused (409) and runs nothing; a performed action redirects (303) to its
result page, which a reload only shows again. Static assets are served from memory with a day's cache
lifetime (their names carry no version).
"""

from __future__ import annotations

import asyncio
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from examlops.core.errors import ExamlopsError, Unauthenticated
from examlops.dashboard import actions
from examlops.dashboard.ports import Authenticator, Pipeline
from examlops.dashboard.sessions import COOKIE, consume_once, csrf_matches, issue_once, keep_result
from examlops.dashboard.site import PREFIX, Redirect, Site, sources_of, status_of
from examlops.dashboard.web import read_form, same_origin

READ_ONLY = "authentication is off: read-only"
"""Without identities no action can name who made it, so none is taken."""
ALREADY_USED = (
    "This confirmation was already used (or is too old): the action did not run again. Start again from the "
    "models page."
)
STATIC = {
    "htmx.min.js": "text/javascript",
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}


def add_access_routes(router: APIRouter, site: Site, pipeline: Pipeline) -> None:
    sessions = site.sessions
    static = {name: (resources.files("examlops.dashboard").joinpath("static", name).read_bytes(), kind)
              for name, kind in STATIC.items()}  # fmt: skip

    @router.get("/static/{name}")
    async def asset(name: str) -> Response:
        if name not in static:
            return Response("not found", status_code=404)
        body, kind = static[name]
        return Response(body, media_type=kind, headers={"Cache-Control": "public, max-age=86400"})

    @router.get("/login")
    async def login_form(request: Request, expired: int = 0) -> Response:
        if request.app.state.identities is None:
            return RedirectResponse(f"{PREFIX}/models", status_code=303)
        return site.page(request, "login.html", expired=bool(expired), error=None)

    @router.post("/login")
    async def login(request: Request) -> Response:
        identities: Authenticator | None = request.app.state.identities
        if identities is None:
            return RedirectResponse(f"{PREFIX}/models", status_code=303)
        if not same_origin(request):
            return Response("a login must come from the dashboard's own page", status_code=403)
        form = await read_form(request)
        token = form.get("token", "").strip()
        try:
            await asyncio.to_thread(identities.authenticate, token)
        except Unauthenticated:
            return site.page(request, "login.html", status=401, expired=False, error="That token is not valid.")
        session_id, _ = sessions.open(token)
        sessions.close(request.cookies.get(COOKIE))  # a login replaces the session it came from
        response = RedirectResponse(f"{PREFIX}/models", status_code=303)
        return site.with_cookie(response, session_id, secure=request.url.scheme == "https")

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        if not same_origin(request):
            return Response("a logout must come from the dashboard's own page", status_code=403)
        sessions.close(request.cookies.get(COOKIE))
        response = RedirectResponse(f"{PREFIX}/login", status_code=303)
        response.delete_cookie(COOKIE, path=PREFIX)
        return response

    @router.get("/confirm")
    async def confirm(request: Request) -> Response:
        try:
            caller, session, _ = await site.session_of(request)
        except Redirect as redirect:
            return RedirectResponse(redirect.to, status_code=303)
        if request.app.state.identities is None:
            return site.refused(request, caller, session, 403, READ_ONLY)
        form = dict(request.query_params)
        try:
            asked = actions.parse(form, pipeline)
            actions.authorize(caller, asked, pipeline)
            actions.check(asked, pipeline)  # nothing is confirmed that would be refused
        except ExamlopsError as exc:
            return site.refused(request, caller, session, status_of(exc), str(exc))
        once = issue_once(session, actions.fingerprint(asked))
        return site.page(request, "confirm.html", caller=caller.name, csrf=session.csrf, auth=True,
                         description=actions.describe(asked), form=form, once=once)  # fmt: skip

    @router.post("/actions")
    async def act(request: Request) -> Response:
        try:
            caller, session, _ = await site.session_of(request)
        except Redirect:
            return Response("log in first", status_code=401)
        if request.app.state.identities is None:
            return site.refused(request, caller, session, 403, READ_ONLY)
        if not same_origin(request):
            return Response("an action must come from the dashboard's own page", status_code=403)
        form = await read_form(request)
        if not csrf_matches(session, form.get("csrf")):
            refusal = "The form's CSRF token does not match this session: reload the page."
            return site.refused(request, caller, session, 403, refusal)
        try:
            asked = actions.parse(form, pipeline)
            actions.authorize(caller, asked, pipeline)
        except ExamlopsError as exc:
            return site.refused(request, caller, session, status_of(exc), str(exc))
        if not consume_once(session, form.get("once"), actions.fingerprint(asked)):
            return site.refused(request, caller, session, 409, ALREADY_USED)
        try:
            outcome = await actions.perform(caller, asked, pipeline, sources_of(request))
        except ExamlopsError as exc:
            return site.refused(request, caller, session, status_of(exc), str(exc))
        result_id = keep_result(session, True, outcome.message, outcome.warnings)
        return RedirectResponse(f"{PREFIX}/result/{result_id}", status_code=303)  # a reload does not post again

    @router.get("/result/{result_id}")
    async def result(request: Request, result_id: str) -> Response:
        try:
            caller, session, _ = await site.session_of(request)
        except Redirect as redirect:
            return RedirectResponse(redirect.to, status_code=303)
        kept = session.results.get(result_id)
        if kept is None:
            return site.refused(request, caller, session, 404, "No such result in this session.")
        ok, message, warnings = kept
        return site.page(request, "result.html", caller=caller.name, csrf=session.csrf, auth=True, ok=ok,
                         message=message, warnings=warnings)  # fmt: skip
