"""The dashboard's routes under ``/dashboard``: the reading pages, their in-place fragments and chart data.

``dashboard_router(settings, pipeline, metrics, traces=..., jobs=...)`` is the one router the app factory
includes; its lifespan samples serving's request rates on a timer (``rates.RateHistory``) whether or not a
page is open. The sources the composition root builds are read from ``app.state`` (``site.attach_sources``),
the identity resolver from ``app.state.identities`` as the API's auth does. Every page but the login form
needs a session (``site.Site``): without one it redirects to the login form. Login, logout, the static assets
and the actions are in ``access.py``. Pages answer HTML; a failing source shows its error in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response

from examlops.core.settings import Settings
from examlops.dashboard import views
from examlops.dashboard.access import add_access_routes
from examlops.dashboard.ports import DashboardSources, Pipeline
from examlops.dashboard.rates import RateHistory, chart_data
from examlops.dashboard.sessions import SessionStore
from examlops.dashboard.site import PREFIX, Redirect, Site, sources_of, threaded
from examlops.dashboard.web import REPORT_HEADERS
from examlops.identity import Caller
from examlops.jobs.service import JobService
from examlops.tracing import TraceStore

REPORTS_PER_MODEL = 5000
"""The drift rows per model whose Evidently report a page may hand out."""


def dashboard_router(
    settings: Settings,
    pipeline: Pipeline,
    metrics: Any,
    *,
    traces: TraceStore | None = None,
    jobs: JobService | None = None,
) -> APIRouter:
    rates = RateHistory(metrics)

    @contextlib.asynccontextmanager
    async def sampling(_: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(rates.run(), name="dashboard-rates")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    router = APIRouter(prefix=PREFIX, include_in_schema=False, lifespan=sampling)
    site = Site(SessionStore())

    @router.get("")
    async def home() -> RedirectResponse:
        return RedirectResponse(f"{PREFIX}/models", status_code=303)

    def models_of(caller: Caller, sources: DashboardSources) -> dict[str, Any]:
        return views.models_view(caller, settings, pipeline, sources, rates)

    @router.get("/models")
    async def models_page(request: Request) -> Response:
        return await site.shown(request, "models.html", threaded(models_of))

    @router.get("/models/fragment")
    async def models_fragment(request: Request) -> Response:
        return await site.shown(request, "_models.html", threaded(models_of))

    @router.get("/models/series.json")
    async def models_series(request: Request) -> Response:
        try:
            caller, _, _ = await site.session_of(request)
        except Redirect:
            return JSONResponse({"error": "log in"}, status_code=401)
        data = {name: chart_data(rates.series(name)) for name in views.visible_models(caller, pipeline)}
        return JSONResponse(data, headers={"Cache-Control": "no-store"})

    @router.get("/models/{name}/runs")
    async def model_runs(request: Request, name: str) -> Response:
        return await site.shown(request, "runs.html", threaded(lambda c, s: views.runs_view(c, pipeline, s, name)))

    @router.get("/drift")
    async def drift_page(request: Request) -> Response:
        return await site.shown(request, "drift.html", threaded(lambda c, s: views.drift_view(c, pipeline, s)))

    @router.get("/drift/series.json")
    async def drift_series(request: Request) -> Response:
        try:
            caller, _, _ = await site.session_of(request)
        except Redirect:
            return JSONResponse({"error": "log in"}, status_code=401)
        view = await asyncio.to_thread(views.drift_view, caller, pipeline, sources_of(request))
        return JSONResponse(view["series"], headers={"Cache-Control": "no-store"})

    @router.get("/drift/report")
    async def drift_report(request: Request, path: str) -> Response:
        try:
            caller, _, _ = await site.session_of(request)
        except Redirect as redirect:
            return RedirectResponse(redirect.to, status_code=303)
        drift = sources_of(request).drift

        def allowed() -> set[str]:
            if drift is None:
                return set()
            return {p.report_html for name in views.visible_models(caller, pipeline)
                    for p in drift.history(name, REPORTS_PER_MODEL)}  # fmt: skip

        if not path.endswith(".html") or path not in await asyncio.to_thread(allowed):
            return Response("no such report", status_code=404)
        if not await asyncio.to_thread(os.path.isfile, path):
            return Response("that report is no longer on disk (retention removed it)", status_code=404)
        return FileResponse(path, media_type="text/html", headers=REPORT_HEADERS)

    def control_of(caller: Caller, sources: DashboardSources) -> dict[str, Any]:
        return views.control_view(caller, pipeline, sources)

    @router.get("/control")
    async def control_page(request: Request) -> Response:
        return await site.shown(request, "control.html", threaded(control_of))

    @router.get("/control/fragment")
    async def control_fragment(request: Request) -> Response:
        return await site.shown(request, "_control.html", threaded(control_of))

    async def jobs_of(caller: Caller, _: DashboardSources) -> dict[str, Any]:
        listed = await jobs.jobs(caller, limit=50) if jobs is not None else []
        return {"jobs": views.job_rows(listed), "jobs_available": jobs is not None}

    @router.get("/traces")
    async def traces_page(request: Request) -> Response:
        filters = dict(request.query_params)

        async def build(caller: Caller, sources: DashboardSources) -> dict[str, Any]:
            view = await asyncio.to_thread(views.traces_view, caller, traces, filters)
            return {**view, **await jobs_of(caller, sources), "query": urlencode(view["filters"])}

        return await site.shown(request, "traces.html", build)

    @router.get("/traces/jobs")
    async def jobs_fragment(request: Request) -> Response:
        """The jobs' refresh: their progress only, no trace search."""
        return await site.shown(request, "_jobs.html", jobs_of)

    add_access_routes(router, site, pipeline)
    return router
