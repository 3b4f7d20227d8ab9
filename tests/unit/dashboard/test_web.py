"""The dashboard's HTTP manners: a lost session during a refresh, cross-site form posts, the reports it
hands out, and the cookie behind TLS."""

from __future__ import annotations

from pathlib import Path

import httpx

from examlops.dashboard import DashboardSources, attach_sources
from examlops.dashboard.ports import DriftPoint
from examlops.identity import Role
from tests.unit.dashboard.fakes import FixedDrift
from tests.unit.dashboard.test_pages import Site, confirmed, site  # noqa: F401  # the fixture


async def test_a_refresh_after_the_session_is_gone_sends_htmx_to_the_login_page(site: Site) -> None:  # noqa: F811
    refresh = await site.client.get("/dashboard/models/fragment", headers={"HX-Request": "true"})
    assert refresh.status_code == 401 and refresh.headers["HX-Redirect"] == "/dashboard/login"
    page = await site.client.get("/dashboard/models")
    assert page.status_code == 303 and page.headers["location"] == "/dashboard/login"


async def test_a_form_posted_from_another_site_is_refused(site: Site) -> None:  # noqa: F811
    _, issued = site.service.add("ops", Role.OPERATOR)
    foreign = {"Origin": "https://evil.example"}
    login = await site.client.post("/dashboard/login", data={"token": issued.token}, headers=foreign)
    assert login.status_code == 403 and "set-cookie" not in login.headers
    own = await site.client.post("/dashboard/login", data={"token": issued.token}, headers={"Origin": "http://serving"})
    assert own.status_code == 303
    # A form that is valid in every other way (this session's CSRF and one-time tokens): only the Origin refuses it.
    form = confirmed((await site.client.get("/dashboard/confirm", params={"action": "reload", "model": "JPCP"})).text)
    action = await site.client.post("/dashboard/actions", data=form, headers=foreign)
    logout = await site.client.post("/dashboard/logout", headers=foreign)
    assert action.status_code == 403 and "must come from the dashboard's own page" in action.text
    assert logout.status_code == 403 and site.pipeline.reloads == [] and site.audit.events == []
    assert (await site.client.post("/dashboard/actions", data=form)).status_code == 303  # the same form, from here


async def test_a_report_is_sandboxed_and_one_retention_removed_is_a_404(site: Site, tmp_path: Path) -> None:  # noqa: F811
    report = tmp_path / "report.html"
    report.write_text("<html><script>1</script></html>")
    gone = tmp_path / "gone.html"
    points = [DriftPoint("JPCP", "prediction", "1", 1.7e9, 0.01, 0.05, True, str(p)) for p in (report, gone)]
    transport = site.client._transport
    assert isinstance(transport, httpx.ASGITransport)
    attach_sources(transport.app, DashboardSources(drift=FixedDrift(points)))  # type: ignore[arg-type]
    await site.login("ops", Role.OPERATOR)
    shown = await site.client.get("/dashboard/drift/report", params={"path": str(report)})
    assert shown.status_code == 200 and shown.headers["content-security-policy"] == "sandbox allow-scripts"
    missing = await site.client.get("/dashboard/drift/report", params={"path": str(gone)})
    assert missing.status_code == 404 and "no longer on disk" in missing.text


async def test_behind_tls_the_session_cookie_is_secure(site: Site) -> None:  # noqa: F811
    _, issued = site.service.add("ops", Role.OPERATOR)
    transport = site.client._transport
    async with httpx.AsyncClient(transport=transport, base_url="https://serving") as tls:
        reply = await tls.post("/dashboard/login", data={"token": issued.token})
    assert reply.status_code == 303 and "secure" in reply.headers["set-cookie"].lower()
    plain = await site.client.post("/dashboard/login", data={"token": issued.token})
    assert "secure" not in plain.headers["set-cookie"].lower()
