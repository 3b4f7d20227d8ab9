"""What each page shows, as plain dicts for the templates: gathered from the sources, filtered by the caller.

Visibility: an identity with ``read_traces`` (operators, admins) sees every model, the audit trail, the loop
and every trace; any other identity sees the models it may call (``Caller.may_call``), their drift and its
own offline jobs, and the pages say what is hidden and why. Actions are offered only with their permission;
``actions.py`` checks again. Every function here may block (SQL, Redis): the routes call them from a thread.
A source that fails (an ``ExamlopsError``) becomes a ``problem`` string on the page, never a 500.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from examlops.core.errors import ExamlopsError, Forbidden
from examlops.core.settings import Settings
from examlops.dashboard.ports import (
    AuditCheck,
    AuditEntry,
    DashboardSources,
    DriftPoint,
    FailureWindow,
    FlowRun,
    Pipeline,
)
from examlops.dashboard.rates import RateHistory
from examlops.identity import Caller, Permission
from examlops.serving.metrics import PINNED_ALIAS
from examlops.tracing import TraceQuery, TraceRecord, TraceStore

T = TypeVar("T")
OPERATOR_VIEW = Permission.READ_TRACES
"""The permission that shows every model, the audit trail, the loop and every trace."""
ACTIONS = {
    "split": Permission.SET_TRAFFIC,
    "reload": Permission.RELOAD,
    "promote": Permission.PROMOTE,
    "rollback": Permission.ROLLBACK,
}


def visible_models(caller: Caller, pipeline: Pipeline) -> list[str]:
    names = [spec.name for spec in pipeline.catalog]
    if caller.has(OPERATOR_VIEW):
        return names
    shown = []
    for name in names:
        try:
            caller.may_call(model=name)
        except Forbidden:
            continue
        shown.append(name)
    return shown


def attempt(problems: list[str], what: str, read: Callable[[], T], default: T) -> T:
    try:
        return read()
    except ExamlopsError as exc:
        problems.append(f"{what}: {exc}")
        return default


def when(ts: float | None) -> str:
    return "-" if not ts else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def models_view(
    caller: Caller, settings: Settings, pipeline: Pipeline, sources: DashboardSources, rates: RateHistory
) -> dict[str, Any]:
    problems: list[str] = []
    names = visible_models(caller, pipeline)
    failures, loop_records = sources.failures, sources.loops
    windows: dict[str, FailureWindow] = {}
    if failures is not None:
        windows = attempt(problems, "failure windows", lambda: failures.windows(names), windows)
    loops: dict[str, dict[str, Any]] = {}
    if loop_records is not None:
        loops = attempt(problems, "loop records", loop_records.records, loops)
    entries = [asdict(e) for e in pipeline.hot_set()]
    models = []
    for name in names:
        summary = rates.summary(name)
        # a pinned version has no alias in the hot set; serving counts its requests under the alias "pinned"
        aliases = [{**e, "loaded": when(e.get("loaded_at")), "rates": summary.get(e["alias"] or PINNED_ALIAS, {})}
                   for e in entries if e["model"] == name]  # fmt: skip
        no_split: dict[str, int] = {}
        traffic = attempt(problems, f"traffic of {name}", partial(pipeline.traffic, name), no_split)
        window = windows.get(name)
        loop = loops.get(name) or {"phase": "serving", "note": "no loop has run"}
        models.append(
            {
                "name": name,
                "aliases": aliases,
                "traffic": traffic,
                "rates": summary,
                "window": asdict(window) if window else None,
                "tripped": bool(window and window.size and window.rate >= settings.failure.threshold),
                "loop": loop,
                "mlflow_url": f"{sources.links['mlflow']}/#/models/{name}" if "mlflow" in sources.links else None,
            }
        )
    return {
        "models": models,
        "hidden": len(pipeline.catalog.names) - len(names),
        "threshold": settings.failure.threshold,
        "window_size": settings.failure.window,
        "cooldown_s": settings.failure.cooldown_s,
        "problems": problems,
        "may": {action: caller.has(permission) for action, permission in ACTIONS.items()},
    }


def drift_view(caller: Caller, pipeline: Pipeline, sources: DashboardSources, limit: int = 500) -> dict[str, Any]:
    """Per visible model its newest ``limit`` drift rows (each model its own, so a busy one hides no other)."""
    problems: list[str] = []
    names = visible_models(caller, pipeline)
    drift = sources.drift
    series: dict[str, dict[str, dict[str, list[float]]]] = {}
    points: list[DriftPoint] = []
    for name in names:
        none: list[DriftPoint] = []
        rows = (
            attempt(problems, f"drift status of {name}", partial(drift.history, name, limit), none) if drift else none
        )
        for p in rows:
            kind = series.setdefault(p.model, {}).setdefault(p.kind, {"at": [], "score": []})
            kind["at"].append(p.at)
            kind["score"].append(p.score)
        points.extend(rows)
    points.sort(key=lambda p: p.at, reverse=True)
    reports = [{**asdict(p), "when": when(p.at)} for p in points[:100]]
    return {
        "models": sorted(names),
        "series": series,
        "reports": reports,
        "available": drift is not None,
        "problems": problems,
    }


def runs_view(caller: Caller, pipeline: Pipeline, sources: DashboardSources, model: str) -> dict[str, Any]:
    """The newest flow runs whose parameters name ``model`` (a model the caller may not see has none)."""
    problems: list[str] = []
    runs: list[FlowRun] = []
    visible = model in visible_models(caller, pipeline)
    if visible and sources.runs is not None:
        flow_runs = sources.runs
        runs = attempt(problems, "Prefect flow runs", partial(flow_runs.runs, model, 50), runs)
    rows = [{**asdict(r), "started": when(r.started_at)} for r in runs]
    return {"model": model, "visible": visible, "available": sources.runs is not None, "runs": rows,
            "problems": problems}  # fmt: skip


def control_view(caller: Caller, pipeline: Pipeline, sources: DashboardSources) -> dict[str, Any]:
    """The audit trail's last events, the last stored verify result (never a walk of the chain: 0.99 s for 30,000
    events, ``bench/RESULTS.md``) and the loop per model. The result is ``stale`` (not current, never shown as
    intact) once older than its ``stale_after_s``; ``appended`` counts the events after the seq it covered,
    from the newest event the page read (None without events)."""
    problems: list[str] = []
    if not caller.has(OPERATOR_VIEW):
        return {"allowed": False, "permission": OPERATOR_VIEW.value, "problems": problems}
    events: list[AuditEntry] = []
    check: AuditCheck | None = None
    if sources.audit is not None:
        events = attempt(problems, "audit trail", partial(sources.audit.tail, 30), events)
        check = attempt(problems, "last audit verify", sources.audit.last_check, check)
    loops: dict[str, dict[str, Any]] = {}
    if sources.loops is not None:
        loops = attempt(problems, "loop records", sources.loops.records, loops)
    now = time.time()
    loop_rows = []
    for name in visible_models(caller, pipeline):
        record = loops.get(name) or {"phase": "serving", "note": "no loop has run"}
        loop_rows.append({"model": name, **record, "since": when(record.get("updated_at"))})
    head = max((e.seq for e in events), default=None)
    return {
        "allowed": True,
        "events": list(reversed(events)),
        "audit_available": sources.audit is not None,
        "check": check,
        "checked_at": when(check.at) if check else "-",
        "checked_ago": _ago(now - check.at) if check and check.at else "",
        "stale": check is not None and now - check.at > check.stale_after_s,
        "stale_after": _ago(check.stale_after_s).removesuffix(" ago") if check else "",
        "appended": max(0, head - check.last_seq) if check and head is not None else None,
        "loops": loop_rows,
        "now": when(now),
        "problems": problems,
    }


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


TRACE_FIELDS = ("identity", "task", "model", "outcome")


def traces_view(caller: Caller, traces: TraceStore | None, filters: dict[str, str]) -> dict[str, Any]:
    problems: list[str] = []
    query = {k: v.strip() for k, v in filters.items() if k in TRACE_FIELDS and v.strip()}
    if not caller.has(Permission.READ_TRACES):
        return {"allowed": False, "permission": Permission.READ_TRACES.value, "filters": query, "problems": []}
    if traces is None:
        return {"allowed": True, "available": False, "filters": query, "traces": [], "problems": []}
    outcome = query.get("outcome")
    if outcome not in (None, "answered", "refused", "failed"):
        problems.append(f"outcome must be answered, refused or failed, not {outcome!r}")
        outcome = None
    nothing: list[TraceRecord] = []
    found = attempt(
        problems,
        "trace store",
        lambda: traces.find(
            TraceQuery(
                identity=query.get("identity"),
                task=query.get("task"),
                model=query.get("model"),
                outcome=outcome,  # type: ignore[arg-type]  # checked against the three outcomes above
                limit=50,
            )
        ),
        nothing,
    )
    rows = [
        {
            "trace_id": t.trace_id, "when": when(t.at), "channel": t.channel, "identity": t.identity, "task": t.task,
            "model": t.model, "alias": t.alias, "version": t.version, "outcome": t.outcome,
            "error_code": t.error_code, "used_ms": round(t.used_ms, 1), "budget_ms": t.budget_ms,
        }
        for t in found
    ]  # fmt: skip
    return {"allowed": True, "available": True, "filters": query, "traces": rows, "problems": problems}


def job_rows(jobs: list[Any]) -> list[dict[str, Any]]:
    return [
        {
            "id": j.id, "identity": j.identity, "task": j.task, "model": j.model, "state": str(j.state),
            "answered": j.answered, "total": j.total, "errors": j.errors, "created": when(j.created_at),
            "percent": round(100.0 * j.answered / j.total) if j.total else 100,
        }
        for j in jobs
    ]  # fmt: skip
