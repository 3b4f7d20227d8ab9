"""The dashboard's routes under ``/dashboard``: pages, their in-place fragments, chart data, login, actions.

``dashboard_router(settings, pipeline, metrics, traces=..., jobs=...)`` is the one router the app factory
includes; the sources the composition root builds are read from ``app.state`` (``attach_sources``), the
identity resolver from ``app.state.identities`` as the API's auth does. Every page but the login form needs
a session (``sessions.py``): without one it redirects to the login form; with authentication off
(development) a session is opened on the first visit and acts as ``SYSTEM_CALLER``. Actions are POSTs with the
session's CSRF token, refused with 403 before anything happens when the token or the permission is missing.
Pages answer HTML; a failing source shows its error in place (``views.attempt``). Static assets are served
from memory with a long cache lifetime (their names carry no version, so a day).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from examlops.core.errors import ExamlopsError, Forbidden, InvalidInput, NotFound, Unauthenticated
from examlops.core.settings import Settings
from examlops.dashboard import actions, views
from examlops.dashboard.ports import AuditCheck, Authenticator, DashboardSources, Pipeline
from examlops.dashboard.rates import RateSampler, chart_data
from examlops.dashboard.sessions import COOKIE, Session, SessionStore, csrf_matches
from examlops.dashboard.web import HEADERS, REPORT_HEADERS, read_form, same_origin, to_login
from examlops.identity import SYSTEM_CALLER, Caller
from examlops.jobs.service import JobService
from examlops.tracing import TraceStore

PREFIX = "/dashboard"
STATE_KEY = "dashboard_sources"
REFRESH_S = 5
"""Seconds between in-place refreshes of a page's figures."""
VERIFY_EVERY_S = 60.0
"""`exa audit verify` walks the whole chain: the control page reuses one result this long."""
STATIC = {
    "htmx.min.js": "text/javascript",
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}
# The dashboard answers HTML, not the API's JSON errors, so it keeps its own short table (api/errors.py
# keeps the API's); anything else is a dependency's failure.
STATUS = ((Unauthenticated, 401), (Forbidden, 403), (InvalidInput, 400), (NotFound, 404))


def attach_sources(app: FastAPI, sources: DashboardSources) -> None:
    """What the composition root calls once it built the app: the dashboard reads these on every request."""
    setattr(app.state, STATE_KEY, sources)


def status_of(error: ExamlopsError) -> int:
    return next((status for kind, status in STATUS if isinstance(error, kind)), 502)


Build = Callable[[Caller, DashboardSources], Awaitable[dict[str, Any]]]
"""What a page shows for a caller, gathered from the sources."""


def threaded(gather: Callable[[Caller, DashboardSources], dict[str, Any]]) -> Build:
    """A blocking view function (SQL, Redis) run off the event loop."""

    async def build(caller: Caller, sources: DashboardSources) -> dict[str, Any]:
        return await asyncio.to_thread(gather, caller, sources)

    return build


class _Redirect(Exception):
    def __init__(self, to: str) -> None:
        self.to = to


def dashboard_router(
    settings: Settings,
    pipeline: Pipeline,
    metrics: Any,
    *,
    traces: TraceStore | None = None,
    jobs: JobService | None = None,
) -> APIRouter:
    router = APIRouter(prefix=PREFIX, include_in_schema=False)
    env = Environment(loader=PackageLoader("examlops.dashboard", "templates"), autoescape=select_autoescape())
    sessions = SessionStore()
    rates = RateSampler(metrics)
    static = {name: (resources.files("examlops.dashboard").joinpath("static", name).read_bytes(), kind)
              for name, kind in STATIC.items()}  # fmt: skip
    checked: dict[str, Any] = {"at": 0.0, "check": None}

    def sources_of(request: Request) -> DashboardSources:
        found = getattr(request.app.state, STATE_KEY, None)
        return found if isinstance(found, DashboardSources) else DashboardSources()

    def page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        sources = sources_of(request)
        html = env.get_template(template).render(
            prefix=PREFIX, refresh_s=REFRESH_S, links=sources.links, path=request.url.path, **context
        )
        return HTMLResponse(html, status_code=status, headers=HEADERS)

    async def session_of(request: Request) -> tuple[Caller, Session, str | None]:
        """The caller and session of a request, and a new session id to set when one was opened."""
        identities: Authenticator | None = request.app.state.identities
        session = sessions.get(request.cookies.get(COOKIE))
        if identities is None:
            if session is not None:
                return SYSTEM_CALLER, session, None
            session_id, session = sessions.open(None)
            return SYSTEM_CALLER, session, session_id
        if session is None:
            raise _Redirect(f"{PREFIX}/login")
        try:
            caller = await asyncio.to_thread(identities.authenticate, session.token)
        except Unauthenticated:
            sessions.close(request.cookies.get(COOKIE))
            raise _Redirect(f"{PREFIX}/login?expired=1") from None
        return caller, session, None

    def with_cookie(response: Response, session_id: str | None, *, secure: bool = False) -> Response:
        if session_id is not None:
            response.set_cookie(COOKIE, session_id, httponly=True, samesite="strict", path=PREFIX,
                                secure=secure)  # fmt: skip
        return response

    async def shown(request: Request, template: str, build: Build) -> Response:
        try:
            caller, session, new = await session_of(request)
        except _Redirect as redirect:
            return to_login(request, redirect.to)
        context = await build(caller, sources_of(request))
        response = page(request, template, caller=caller.name, csrf=session.csrf,
                        auth=request.app.state.identities is not None, **context)  # fmt: skip
        return with_cookie(response, new, secure=request.url.scheme == "https")

    @router.get("")
    async def home() -> RedirectResponse:
        return RedirectResponse(f"{PREFIX}/models", status_code=303)

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
        return page(request, "login.html", expired=bool(expired), error=None)

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
            return page(request, "login.html", status=401, expired=False, error="That token is not valid.")
        session_id, _ = sessions.open(token)
        sessions.close(request.cookies.get(COOKIE))  # a login replaces the session it came from
        response = RedirectResponse(f"{PREFIX}/models", status_code=303)
        return with_cookie(response, session_id, secure=request.url.scheme == "https")

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        if not same_origin(request):
            return Response("a logout must come from the dashboard's own page", status_code=403)
        sessions.close(request.cookies.get(COOKIE))
        response = RedirectResponse(f"{PREFIX}/login", status_code=303)
        response.delete_cookie(COOKIE, path=PREFIX)
        return response

    def models_of(caller: Caller, sources: DashboardSources) -> dict[str, Any]:
        return views.models_view(caller, settings, pipeline, sources, rates)

    @router.get("/models")
    async def models_page(request: Request) -> Response:
        return await shown(request, "models.html", threaded(models_of))

    @router.get("/models/fragment")
    async def models_fragment(request: Request) -> Response:
        return await shown(request, "_models.html", threaded(models_of))

    @router.get("/models/series.json")
    async def models_series(request: Request) -> Response:
        try:
            caller, _, _ = await session_of(request)
        except _Redirect:
            return JSONResponse({"error": "log in"}, status_code=401)
        rates.sample()
        data = {name: chart_data(rates.series(name)) for name in views.visible_models(caller, pipeline)}
        return JSONResponse(data, headers={"Cache-Control": "no-store"})

    @router.get("/drift")
    async def drift_page(request: Request) -> Response:
        return await shown(request, "drift.html", threaded(lambda c, s: views.drift_view(c, pipeline, s)))

    @router.get("/drift/series.json")
    async def drift_series(request: Request) -> Response:
        try:
            caller, _, _ = await session_of(request)
        except _Redirect:
            return JSONResponse({"error": "log in"}, status_code=401)
        view = await asyncio.to_thread(views.drift_view, caller, pipeline, sources_of(request))
        return JSONResponse(view["series"], headers={"Cache-Control": "no-store"})

    @router.get("/drift/report")
    async def drift_report(request: Request, path: str) -> Response:
        try:
            caller, _, _ = await session_of(request)
        except _Redirect as redirect:
            return RedirectResponse(redirect.to, status_code=303)
        sources = sources_of(request)
        rows = await asyncio.to_thread(sources.drift.history, 5000) if sources.drift else []
        shown = views.visible_models(caller, pipeline)
        allowed = {p.report_html for p in rows if p.model in shown}
        if path not in allowed or not path.endswith(".html"):
            return Response("no such report", status_code=404)
        if not await asyncio.to_thread(os.path.isfile, path):
            return Response("that report is no longer on disk (retention removed it)", status_code=404)
        return FileResponse(path, media_type="text/html", headers=REPORT_HEADERS)

    def control_of(caller: Caller, sources: DashboardSources) -> dict[str, Any]:
        if (
            sources.audit is not None
            and caller.has(views.OPERATOR_VIEW)
            and (checked["check"] is None or time.monotonic() - checked["at"] > VERIFY_EVERY_S)
        ):
            try:
                checked["check"] = sources.audit.verify()
            except ExamlopsError as exc:
                checked["check"] = AuditCheck(0, 0, f"cannot verify: {exc}")
            checked["at"], checked["wall"] = time.monotonic(), time.time()
        view = views.control_view(caller, pipeline, sources, checked["check"])
        return {**view, "checked_at": views.when(checked.get("wall"))}

    @router.get("/control")
    async def control_page(request: Request) -> Response:
        return await shown(request, "control.html", threaded(control_of))

    @router.get("/control/fragment")
    async def control_fragment(request: Request) -> Response:
        return await shown(request, "_control.html", threaded(control_of))

    async def traces_of(request: Request) -> Response:
        filters = dict(request.query_params)

        async def build(caller: Caller, sources: DashboardSources) -> dict[str, Any]:
            listed = await jobs.jobs(caller, limit=50) if jobs is not None else []
            view = await asyncio.to_thread(views.traces_view, caller, traces, filters)
            return {**view, "jobs": views.job_rows(listed), "jobs_available": jobs is not None,
                    "query": urlencode(view["filters"])}  # fmt: skip

        return await shown(request, "traces.html" if request.url.path.endswith("/traces") else "_jobs.html", build)

    router.get("/traces")(traces_of)
    router.get("/traces/jobs")(traces_of)

    @router.get("/confirm")
    async def confirm(request: Request) -> Response:
        try:
            caller, session, _ = await session_of(request)
        except _Redirect as redirect:
            return RedirectResponse(redirect.to, status_code=303)
        form = dict(request.query_params)
        try:
            asked = actions.parse(form, pipeline)
            actions.authorize(caller, asked, pipeline)
        except ExamlopsError as exc:
            return page(request, "result.html", status=status_of(exc), caller=caller.name, csrf=session.csrf,
                        auth=True, ok=False, message=str(exc))  # fmt: skip
        return page(request, "confirm.html", caller=caller.name, csrf=session.csrf, auth=True,
                    description=actions.describe(asked), form=form)  # fmt: skip

    @router.post("/actions")
    async def act(request: Request) -> Response:
        try:
            caller, session, _ = await session_of(request)
        except _Redirect:
            return Response("log in first", status_code=401)
        if not same_origin(request):
            return Response("an action must come from the dashboard's own page", status_code=403)
        form = await read_form(request)
        if not csrf_matches(session, form.get("csrf")):
            refusal = "The form's CSRF token does not match this session: reload the page."
            return page(request, "result.html", status=403, caller=caller.name, csrf=session.csrf, auth=True,
                        ok=False, message=refusal)  # fmt: skip
        try:
            message = await actions.perform(caller, actions.parse(form, pipeline), pipeline, sources_of(request))
        except ExamlopsError as exc:
            return page(request, "result.html", status=status_of(exc), caller=caller.name, csrf=session.csrf,
                        auth=True, ok=False, message=str(exc))  # fmt: skip
        return page(request, "result.html", caller=caller.name, csrf=session.csrf, auth=True, ok=True,
                    message=message)  # fmt: skip

    return router
