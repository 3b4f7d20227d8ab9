"""The dashboard's pages and actions through the serving app, with fakes at the dashboard's ports."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from html import unescape

import httpx
import pytest
from prometheus_client import CollectorRegistry

from examlops.api.app import create_app
from examlops.core.settings import Settings
from examlops.dashboard import DashboardSources, attach_sources
from examlops.dashboard.ports import AuditCheck, DriftPoint, FailureWindow, FlowRun
from examlops.dashboard.sessions import COOKIE
from examlops.identity import IdentityResolver, IdentityService, Role
from examlops.registry.catalog import load_catalog
from examlops.tracing import TraceQuery, TraceRecord
from tests.unit.dashboard.fakes import (
    FixedDrift,
    FixedFailures,
    FixedLoops,
    FixedRuns,
    HotPipeline,
    InMemoryAudit,
    RecordingPromoter,
)
from tests.unit.identity.fakes import InMemoryIdentityStore
from tests.unit.tracing.test_tracing import InMemoryTraceStore

RUN = FlowRun("r1", "brave-otter", "retrain", "Completed", 1.7e9, "http://127.0.0.1:18003/runs/flow-run/r1")


@dataclass
class Site:
    client: httpx.AsyncClient
    pipeline: HotPipeline
    service: IdentityService
    audit: InMemoryAudit
    promoter: RecordingPromoter
    failures: FixedFailures

    async def login(self, name: str, role: Role, models: tuple[str, ...] = ()) -> None:
        _, issued = self.service.add(name, role, models=list(models))
        reply = await self.client.post("/dashboard/login", data={"token": issued.token})
        assert reply.status_code == 303, reply.text


@pytest.fixture
async def site(settings: Settings) -> AsyncIterator[Site]:
    pipeline = HotPipeline(load_catalog(settings.catalog_path))
    service = IdentityService(InMemoryIdentityStore())
    audit = InMemoryAudit()
    promoter = RecordingPromoter(audit)
    failures = FixedFailures({"JPCP": FailureWindow("JPCP", 0.6, 50, 50, 120.0)})
    app = create_app(settings, pipeline, CollectorRegistry(), identities=IdentityResolver(service.store, 30.0))
    attach_sources(
        app,
        DashboardSources(
            audit=audit,
            drift=FixedDrift([DriftPoint("JPCP", "prediction", "1", 1.7e9, 0.01, 0.05, True, "/r/a.html")]),
            failures=failures,
            loops=FixedLoops({"JPCP": {"phase": "canary", "share": 10, "note": "watching"}}),
            promoter=promoter,
            runs=FixedRuns([("JPCP", RUN)]),
            links={"mlflow": "http://127.0.0.1:18002", "prefect": "http://127.0.0.1:18003"},
        ),
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://serving") as client:
        yield Site(client, pipeline, service, audit, promoter, failures)


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None
    return found.group(1)


def confirmed(html: str) -> dict[str, str]:
    """The hidden fields of a confirmation page's form: what its "Yes, do it" button posts."""
    found = re.findall(r'type="hidden" name="([^"]+)" value="([^"]*)"', html)  # the logout form's csrf is the same
    return {name: unescape(value) for name, value in found}


async def test_every_page_needs_a_login_and_the_form_sets_a_strict_httponly_cookie(site: Site) -> None:
    for page in ("models", "drift", "control", "traces", "models/fragment"):
        reply = await site.client.get(f"/dashboard/{page}")
        assert reply.status_code == 303 and reply.headers["location"] == "/dashboard/login"
    _, issued = site.service.add("ops", Role.OPERATOR)
    reply = await site.client.post("/dashboard/login", data={"token": issued.token})
    cookie = reply.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/dashboard" in cookie
    assert issued.token not in cookie
    assert (await site.client.get("/dashboard/models")).status_code == 200


async def test_a_wrong_token_is_refused_and_opens_no_session(site: Site) -> None:
    reply = await site.client.post("/dashboard/login", data={"token": "exa_0123456789abcdef_" + "x" * 43})
    assert reply.status_code == 401 and "not valid" in reply.text
    assert "set-cookie" not in reply.headers


async def test_models_page_shows_each_alias_version_split_window_and_loop(site: Site) -> None:
    site.pipeline.splits["JPCP"] = {"Production": 90, "Canary": 10}
    await site.login("ops", Role.OPERATOR)
    html = (await site.client.get("/dashboard/models")).text
    assert re.search(r'id="version-JPCP-Production">1<', html)
    assert re.search(r'id="version-CRCP-Canary">2<', html)
    assert "run-JPCP-1" in html
    assert "Production 90 %" in html and "Canary 10 %" in html
    assert "0.60" in html and "threshold 0.5" in html and "120 s left" in html
    assert "canary at 10 %" in html
    assert 'href="http://127.0.0.1:18002/#/models/JPCP"' in html
    assert 'id="promote-JPCP"' in html and 'id="set-split-JPCP"' in html


async def test_a_caller_sees_only_its_models_no_actions_no_audit_and_no_traces(site: Site) -> None:
    await site.login("robot", Role.CALLER, models=("JPCP",))
    html = (await site.client.get("/dashboard/models")).text
    assert 'id="model-JPCP"' in html and 'id="model-CRCP"' not in html
    assert "2 model(s) are hidden" in html and "read-only" in html and 'id="promote-JPCP"' not in html
    assert "needs the permission" not in html
    control = (await site.client.get("/dashboard/control")).text
    assert "need the permission <code>read_traces</code>" in control and 'id="audit"' not in control
    traces = (await site.client.get("/dashboard/traces")).text
    assert "Searching traces needs the permission" in traces


async def test_a_failing_source_is_shown_in_place_not_as_an_error(site: Site) -> None:
    site.failures.down = True
    await site.login("ops", Role.OPERATOR)
    reply = await site.client.get("/dashboard/models/fragment")
    assert reply.status_code == 200 and "failure windows: redis is down" in reply.text


async def test_an_operator_sets_a_split_after_confirming_and_it_names_the_identity(site: Site) -> None:
    await site.login("ops", Role.OPERATOR)
    confirm = await site.client.get(
        "/dashboard/confirm", params={"action": "split", "model": "jpcp", "production": "80", "canary": "20"}
    )
    assert confirm.status_code == 200 and "Production 80 % / Canary 20 %" in confirm.text
    assert site.pipeline.traffic_set == []  # nothing happens before the confirmation
    done = await site.client.post("/dashboard/actions", data=confirmed(confirm.text))
    assert done.status_code == 303 and done.headers["location"].startswith("/dashboard/result/"), done.text
    result = await site.client.get(done.headers["location"])
    assert result.status_code == 200 and "traffic split is now Production 80 %, Canary 20 %" in result.text
    assert site.pipeline.traffic_set == [("JPCP", "ops")]
    assert site.pipeline.splits["JPCP"] == {"Production": 80, "Canary": 20}


async def test_an_action_without_the_csrf_token_is_refused_and_does_nothing(site: Site) -> None:
    await site.login("ops", Role.OPERATOR)
    reply = await site.client.post("/dashboard/actions", data={"csrf": "forged", "action": "reload", "model": "JPCP"})
    assert reply.status_code == 403 and "CSRF" in reply.text
    assert site.pipeline.reloads == []


async def test_an_action_without_the_operator_permission_is_refused(site: Site) -> None:
    await site.login("robot", Role.CALLER, models=("JPCP",))
    page = (await site.client.get("/dashboard/models")).text
    confirm = await site.client.get("/dashboard/confirm", params={"action": "promote", "model": "JPCP"})
    assert confirm.status_code == 403 and "lacks the permission 'promote'" in unescape(confirm.text)
    reply = await site.client.post(
        "/dashboard/actions", data={"csrf": csrf_of(page), "action": "promote", "model": "JPCP"}
    )
    assert reply.status_code == 403
    assert site.promoter.asked == []


async def test_a_promotion_goes_through_the_promoter_as_the_identity_and_is_audited(site: Site) -> None:
    await site.login("ops", Role.OPERATOR)
    confirm = await site.client.get("/dashboard/confirm", params={"action": "promote", "model": "JPCP"})
    done = await site.client.post("/dashboard/actions", data=confirmed(confirm.text), follow_redirects=True)
    assert done.status_code == 200 and "version 1 -> 2" in unescape(done.text) and 'id="warnings"' not in done.text
    assert site.promoter.asked == [("promote", "JPCP", "ops")]
    control = (await site.client.get("/dashboard/control")).text
    assert re.search(r"alias\.moved</td><td>JPCP</td><td class=\"actor\">ops<", control)


async def test_a_promotion_of_a_canary_already_in_production_says_nothing_to_do(site: Site) -> None:
    site.promoter.canary_is_production = True
    await site.login("ops", Role.OPERATOR)
    confirm = await site.client.get("/dashboard/confirm", params={"action": "promote", "model": "JPCP"})
    done = await site.client.post("/dashboard/actions", data=confirmed(confirm.text), follow_redirects=True)
    assert done.status_code == 200
    assert "JPCP@Production: already at version 2, nothing moved" in unescape(done.text)
    assert "-&gt;" not in done.text


async def test_a_confirmation_sent_twice_acts_once_and_binds_to_its_own_action(site: Site) -> None:
    await site.login("ops", Role.OPERATOR)
    confirm = await site.client.get("/dashboard/confirm", params={"action": "reload", "model": "JPCP"})
    form = confirmed(confirm.text)
    assert "data-once" in confirm.text  # dashboard.js disables the button as the form submits
    first = await site.client.post("/dashboard/actions", data=form)
    again = await site.client.post("/dashboard/actions", data=form)
    assert first.status_code == 303 and again.status_code == 409 and "already used" in again.text
    assert (await site.client.get(first.headers["location"])).status_code == 200  # a reload of the result
    assert site.pipeline.reloads == [("JPCP", "ops")]
    other = confirmed((await site.client.get("/dashboard/confirm", params={"action": "reload", "model": "JPCP"})).text)
    swapped = await site.client.post("/dashboard/actions", data={**other, "action": "promote"})
    assert swapped.status_code == 409 and site.promoter.asked == []
    assert (await site.client.get("/dashboard/result/unknown")).status_code == 404


async def test_a_promotion_shows_what_the_service_warned_of(site: Site) -> None:
    site.promoter.warnings = ("the audit trail did not account for this alias before the move: v3 set by hand",)
    await site.login("ops", Role.OPERATOR)
    confirm = await site.client.get("/dashboard/confirm", params={"action": "promote", "model": "JPCP"})
    done = await site.client.post("/dashboard/actions", data=confirmed(confirm.text), follow_redirects=True)
    assert done.status_code == 200 and "version 1 -&gt; 2" in done.text
    assert "warning: the audit trail did not account for this alias before the move: v3 set by hand" in done.text


async def test_the_control_page_shows_the_stored_verify_result_and_when_it_was_taken(site: Site) -> None:
    await site.login("ops", Role.OPERATOR)
    before = (await site.client.get("/dashboard/control")).text
    assert "no verify result stored yet" in before
    for _ in range(5):
        site.audit.add("traffic.changed", "JPCP", "ops")
    head = site.audit.events[-1].seq
    a_minute_ago = time.time() - 60
    site.audit.stored = AuditCheck(31_000, 12, None, a_minute_ago, "retention flow", last_seq=head - 2)
    for page in ("control", "control/fragment", "control", "control/fragment"):
        html = (await site.client.get(f"/dashboard/{page}")).text
        assert '<span class="good" id="verify">intact: 31000 events, 12 signed checkpoints' in html
        assert f"covers events up to seq {head - 2}; 2 appended since" in html
        assert "by retention flow at" in html and "not current" not in html
    site.audit.stored = AuditCheck(40, 2, "seq 7 (edited): hash mismatch", a_minute_ago, "exa audit verify")
    assert "broken: seq 7 (edited): hash mismatch" in (await site.client.get("/dashboard/control")).text
    assert site.audit.walks == 0  # serving never walks the chain


async def test_an_old_intact_result_is_shown_as_not_current_never_as_intact(site: Site) -> None:
    await site.login("ops", Role.OPERATOR)
    site.audit.add("traffic.changed", "JPCP", "ops")
    site.audit.stored = AuditCheck(31_000, 12, None, 1.7e9, "retention flow", last_seq=1, stale_after_s=900.0)
    html = (await site.client.get("/dashboard/control")).text
    assert 'class="good" id="verify"' not in html and "intact: 31000" not in html
    assert '<span class="stale" id="verify">not current: the last stored check, older than 15 min' in html
    assert 'by retention flow at <span id="verified-at">2023-11-14 22:13:20 UTC</span>' in html
    assert "covers events up to seq 1; 0 appended since" in html


async def test_a_note_and_an_unreadable_result_are_said_plainly(site: Site) -> None:
    await site.login("ops", Role.OPERATOR)
    note = "aliases not checked: MLflow did not answer within 5 s"
    site.audit.stored = AuditCheck(10, 1, None, time.time(), "retention flow", last_seq=10, notes=(note,))
    html = (await site.client.get("/dashboard/control")).text
    assert 'class="good"' not in html  # what was not checked never shows as intact
    assert 'class="stale" id="verify">chain intact (10 events, 1 signed checkpoints), but not all checked:' in html
    assert f'<span class="stale verify-note">{note}</span>' in html
    unreadable = AuditCheck(0, 0, "the stored verify result cannot be read", 0.0, "?", readable=False)
    site.audit.stored = unreadable
    html = (await site.client.get("/dashboard/control")).text
    assert "unreadable: the stored verify result cannot be read" in html
    assert "(the last stored check: unreadable;" in html and "by ?" not in html and "covers events" not in html


async def test_a_bad_split_is_refused_with_the_services_message(site: Site) -> None:
    await site.login("ops", Role.OPERATOR)
    reply = await site.client.get("/dashboard/confirm", params={"action": "split", "model": "JPCP", "canary": "x"})
    assert reply.status_code == 400 and "whole number" in reply.text


async def test_a_split_that_would_be_refused_is_refused_before_its_confirmation_page(site: Site) -> None:
    await site.login("ops", Role.OPERATOR)
    for weights, refusal in (
        ({"production": "150", "canary": "-50"}, "the weight of Canary must not be negative"),
        ({"production": "60", "canary": "20"}, "weights must add up to 100, not 80"),
    ):
        reply = await site.client.get("/dashboard/confirm", params={"action": "split", "model": "JPCP", **weights})
        assert reply.status_code == 400 and refusal in unescape(reply.text)
        assert "Set the traffic split" not in reply.text and 'name="once"' not in reply.text  # nothing to confirm
    assert site.pipeline.traffic_set == [] and site.pipeline.splits == {}


async def test_drift_page_lists_reports_and_charts_read_their_p_values(site: Site) -> None:
    await site.login("ops", Role.OPERATOR)
    html = (await site.client.get("/dashboard/drift")).text
    assert "DRIFT" in html and "/dashboard/drift/report?path=/r/a.html" in html
    series = (await site.client.get("/dashboard/drift/series.json")).json()
    assert series == {"JPCP": {"prediction": {"at": [1.7e9], "score": [0.01]}}}
    assert (await site.client.get("/dashboard/drift/report", params={"path": "/etc/passwd"})).status_code == 404


async def test_drift_is_read_per_model_so_a_busy_model_hides_no_other(site: Site) -> None:
    busy = [DriftPoint("JPCP", "prediction", "1", 1.7e9 + i, 0.5, 0.05, False, f"/r/{i}.html") for i in range(600)]
    quiet = DriftPoint("AC", "input", "2", 1.6e9, 0.01, 0.05, True, "/r/ac.html")
    transport = site.client._transport
    assert isinstance(transport, httpx.ASGITransport)
    attach_sources(transport.app, DashboardSources(drift=FixedDrift([quiet, *busy])))  # type: ignore[arg-type]
    await site.login("ops", Role.OPERATOR)
    series = (await site.client.get("/dashboard/drift/series.json")).json()
    assert (
        series["AC"] == {"input": {"at": [1.6e9], "score": [0.01]}} and len(series["JPCP"]["prediction"]["at"]) == 500
    )


async def test_the_prefect_link_lists_the_models_own_flow_runs(site: Site) -> None:
    await site.login("ops", Role.OPERATOR)
    models = (await site.client.get("/dashboard/models")).text
    assert 'href="/dashboard/models/JPCP/runs"' in models
    runs = (await site.client.get("/dashboard/models/JPCP/runs")).text
    assert "brave-otter" in runs and "http://127.0.0.1:18003/runs/flow-run/r1" in runs
    assert "brave-otter" not in (await site.client.get("/dashboard/models/AC/runs")).text


async def test_logout_ends_the_session(site: Site) -> None:
    await site.login("ops", Role.OPERATOR)
    await site.client.post("/dashboard/logout")
    assert (await site.client.get("/dashboard/models")).status_code == 303


async def test_a_revoked_identity_loses_its_session(site: Site) -> None:
    await site.login("ops", Role.OPERATOR)
    site.service.revoke("ops")
    resolver = IdentityResolver(site.service.store, 30.0)
    resolver.forget()
    site.client._transport.app.state.identities = resolver  # type: ignore[attr-defined]  # ASGITransport
    reply = await site.client.get("/dashboard/models")
    assert reply.status_code == 303 and "expired" in reply.headers["location"]


async def test_a_session_that_ended_sends_to_the_login_form_saying_so(site: Site) -> None:
    first = await site.client.get("/dashboard/models")
    assert first.status_code == 303 and first.headers["location"] == "/dashboard/login"  # never logged in
    site.client.cookies.set(COOKIE, "a-session-this-process-no-longer-holds", path="/dashboard")
    ended = await site.client.get("/dashboard/models")  # idle or 12 h past its login: the store forgot it
    assert ended.status_code == 303 and ended.headers["location"] == "/dashboard/login?expired=1"


async def test_pages_load_only_their_own_assets(site: Site) -> None:
    await site.login("ops", Role.OPERATOR)
    for page in ("models", "drift", "control", "traces"):
        reply = await site.client.get(f"/dashboard/{page}")
        assert "script-src 'self'" in reply.headers["content-security-policy"]
        for src in re.findall(r'(?:src|href)="([^"]+)"', reply.text):
            assert src.startswith(("/dashboard", "data:", "http://127.0.0.1:1800")), src
    for name in ("htmx.min.js", "uPlot.iife.min.js", "uPlot.min.css", "dashboard.js", "dashboard.css"):
        assert (await site.client.get(f"/dashboard/static/{name}")).status_code == 200
    assert (await site.client.get("/dashboard/static/../routes.py")).status_code == 404


async def test_with_authentication_off_the_dashboard_is_read_only(settings: Settings) -> None:
    pipeline = HotPipeline(load_catalog(settings.catalog_path))
    app = create_app(settings, pipeline, CollectorRegistry(), identities=None)
    audit = InMemoryAudit()
    attach_sources(app, DashboardSources(audit=audit, promoter=RecordingPromoter(audit)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serving") as client:
        reply = await client.get("/dashboard/models")
        assert reply.status_code == 200 and "authentication is off: read-only" in reply.text
        assert "system:auth-off" in reply.text and "set-cookie" in reply.headers
        assert 'id="promote-JPCP"' not in reply.text and 'id="set-split-JPCP"' not in reply.text
        assert 'action="/dashboard/confirm"' not in reply.text
        confirm = await client.get("/dashboard/confirm", params={"action": "reload", "model": "JPCP"})
        assert confirm.status_code == 403 and "authentication is off: read-only" in confirm.text
        for form in ({"action": "reload", "model": "JPCP"}, {"action": "promote", "model": "JPCP"},
                     {"action": "split", "model": "JPCP", "production": "50", "canary": "50"}):  # fmt: skip
            done = await client.post("/dashboard/actions", data={**form, "csrf": "any"})
            assert done.status_code == 403 and "authentication is off: read-only" in done.text
    assert pipeline.reloads == [] and pipeline.traffic_set == [] and audit.events == []


class QueriedTraces(InMemoryTraceStore):
    """Remembers the queries it was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.queries: list[TraceQuery] = []

    def find(self, query: TraceQuery) -> list[TraceRecord]:
        self.queries.append(query)
        return super().find(query)


async def test_trace_search_passes_each_filter_and_shows_what_the_store_found(settings: Settings) -> None:
    traces = QueriedTraces()
    traces.add([TraceRecord("t" * 32, 1.7e9, "http", "failed", "inference_failed", model="JPCP", identity="robot")])
    service = IdentityService(InMemoryIdentityStore())
    app = create_app(settings, HotPipeline(load_catalog(settings.catalog_path)), CollectorRegistry(),
                     identities=IdentityResolver(service.store, 30.0), traces=traces)  # fmt: skip
    _, issued = service.add("ops", Role.OPERATOR)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serving") as client:
        await client.post("/dashboard/login", data={"token": issued.token})
        reply = await client.get(
            "/dashboard/traces", params={"identity": "robot", "model": "JPCP", "outcome": "failed", "task": ""}
        )
    assert reply.status_code == 200 and "inference_failed" in reply.text and "robot" in reply.text
    assert traces.queries == [TraceQuery(identity="robot", model="JPCP", outcome="failed", limit=50)]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serving") as client:
        await client.post("/dashboard/login", data={"token": issued.token})
        jobs = await client.get("/dashboard/traces/jobs", headers={"HX-Request": "true"})
    assert jobs.status_code == 200 and "Offline jobs are not available" in jobs.text
    assert len(traces.queries) == 1  # the jobs' refresh searches no traces
