"""The two scenes of ``closed_loop.py`` as marks on the timeline and must-hold bounds, read from what
``closed_loop_watch.Watch`` saw, the Prefect API, the retrain outbox and the requests themselves.

``burst_report``: the failing version deployed, the trigger, the retrain run, the candidate on Canary, the
analysis, the promotion and each instance serving the candidate; bound: all of it within ``args.bound``.
``worse_report``: the operator's retrain, the candidate on Canary, the analysis and its rejection; bounds:
the decision is ``fail``, Canary's share is 0 everywhere, Production never changed, and the candidate served
nothing once the rejection reached the rules caches.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from closed_loop_report import Bounds, Timeline, gate_summary
from closed_loop_traffic import Call
from closed_loop_watch import Watch, flow_runs, last_retrain_request

from examlops.core.settings import Settings


def _common(settings: Settings, urls: list[str], watch: Watch, timeline: Timeline) -> dict[str, Any]:
    """The marks both scenes share; returns the audit data of the candidate and the decision."""
    t0 = timeline.t0
    found: dict[str, Any] = {}
    for run in flow_runs(settings.prefect_api_url):
        if run["start"] is None or run["start"] < t0 - 5:
            continue
        timeline.mark(run["start"], f"{run['flow']} run {run['name']} started")
        timeline.mark(run["end"], f"{run['flow']} run {run['name']} ended: {run['state']}")
    retrained = watch.first("audit", "model.retrained", after=t0)
    if retrained is not None:
        data = found["retrained"] = retrained.value
        where = f"Canary -> v{data['version']}" if data.get("moved") else "kept back (Canary not moved)"
        production = (f"Production RMSE {data['production_rmse']:.3f}" if data.get("production_rmse") is not None
                      else "Production not scored: its model failed on the holdout")  # fmt: skip
        timeline.mark(retrained.at, f"candidate v{data['version']} registered (holdout RMSE "
                      f"{data['candidate_rmse']:.3f}; {production}): {where}")  # fmt: skip
        for url in urls:  # nothing asks the instances to load the new Canary: their reload poll finds it
            seen = watch.first("serving", f"{url} Canary", lambda v, version=data["version"]: v == version, after=t0)
            timeline.mark(None if seen is None else seen.at, f"{url} serves v{data['version']} as Canary")
    started = watch.first("audit", "loop.canary_started", after=t0)
    if started is not None:
        data = started.value
        timeline.mark(started.at, f"canary analysis started: {data['share']} % to Canary v{data['canary_version']} "
                      f"against Production v{data['production_version']}")  # fmt: skip
        for url in urls:
            split = watch.first("split", url, lambda w: bool(w) and w.get("Canary", 0) > 0, after=started.at)
            timeline.mark(None if split is None else split.at, f"{url} applies the split {split and split.value}")
    decided = watch.first("audit", "loop.decided", after=t0)
    if decided is not None:
        data = found["decided"] = {**decided.value, "at": decided.at}
        timeline.mark(decided.at, f"analysis decided: {data['decision']} ({data.get('note', '')})")
        timeline.mark(decided.at, f"  gates: {gate_summary(data)}")
        timeline.mark(decided.at, f"  Canary {data['canary']}; Production {data['production']}")
    for seen in watch.seen:
        if seen.what == "phase" and seen.at >= t0:
            timeline.mark(seen.at, f"loop record: {seen.value}")
        if seen.what == "audit" and seen.key in ("loop.trigger_dropped", "loop.rolled_back") and seen.at >= t0:
            timeline.mark(seen.at, f"{seen.key}: {seen.value}")
    return found


def old_canary(calls: list[Call], before: Mapping[str, str], timeline: Timeline) -> None:
    """Mark the calls the Canary of before the run answered after the burst start (the split can reach an
    instance before the instance has loaded the new Canary)."""
    late = [c.sent_at for c in calls if c.outcome == "answered" and c.version == before["Canary"]]
    late = [at for at in late if at >= timeline.t0]
    if late:
        timeline.mark(late[0], f"first call answered by the old Canary v{before['Canary']} ({len(late)} in all)")
        timeline.mark(late[-1], f"last call answered by the old Canary v{before['Canary']}")


def burst_report(
    args: argparse.Namespace, settings: Settings, urls: list[str], watch: Watch, calls: list[Call],
    before: Mapping[str, str], after: Mapping[str, str], timeline: Timeline, bounds: Bounds,
) -> None:  # fmt: skip
    t0, failing = timeline.t0, before["Staging"]
    for url in urls:
        seen = watch.first("serving", f"{url} Production", lambda v: v == failing, after=t0 - 1)
        timeline.mark(None if seen is None else seen.at, f"{url} serves the failing v{failing} as Production")
    failures = sorted(c.replied_at for c in calls if c.code == "inference_failed" and c.replied_at is not None)
    timeline.mark(failures[0] if failures else None, "first inference_failed reply")
    timeline.mark(failures[-1] if failures else None, f"last inference_failed reply ({len(failures)} in all)")
    request = last_retrain_request(settings, args.model)
    if request is not None and request["requested_at"] >= t0:
        timeline.mark(request["requested_at"], f"failure trigger fired: {request['reason']}")
        timeline.mark(request.get("delivered_at"), f"retrain request accepted by Prefect (flow run "
                      f"{request.get('flow_run_id')}, attempts {request.get('attempts')})")  # fmt: skip
    else:
        timeline.mark(None, "failure trigger fired")
    requested = watch.first("audit", "retrain.requested", after=t0)
    timeline.mark(None if requested is None else requested.at, "retrain.requested in the audit trail")
    found = _common(settings, urls, watch, timeline)
    old_canary(calls, before, timeline)
    candidate = found.get("retrained", {}).get("version")
    moved = watch.first("audit", "alias.moved", lambda d: d.get("alias") == "Production"
                        and d.get("new_version") == candidate, after=t0)  # fmt: skip
    timeline.mark(None if moved is None else moved.at, f"promotion: Production v{failing} -> v{candidate} "
                  f"({moved.value.get('actor') if moved else ''})")  # fmt: skip
    reached = []
    for url in urls:
        seen = watch.first("serving", f"{url} Production", lambda v: v == candidate, after=t0)
        reached.append(None if seen is None else seen.at)
        timeline.mark(reached[-1], f"{url} serves v{candidate} as Production")
    every = None if candidate is None or None in reached else max(a for a in reached if a is not None)
    timeline.mark(every, f"every instance serves v{candidate} as Production")
    figure = "not reached" if every is None else f"{every - t0:.1f} s (Production is v{after['Production']})"
    bounds.check(f"burst to the new version serving as Production on every instance < {args.bound:g} s",
                 every is not None and every - t0 < args.bound, figure)  # fmt: skip


def worse_report(
    args: argparse.Namespace, settings: Settings, urls: list[str], watch: Watch, calls: list[Call],
    before: Mapping[str, str], after: Mapping[str, str], timeline: Timeline, bounds: Bounds,
) -> None:  # fmt: skip
    production = before["Production"]
    found = _common(settings, urls, watch, timeline)
    old_canary(calls, before, timeline)
    candidate = found.get("retrained", {}).get("version")
    decided = found.get("decided", {})
    failed_gates = decided.get("failed_gates", [])
    bounds.check("the canary analysis rejected the candidate", decided.get("decision") == "fail",
                 f"decision {decided.get('decision', 'none')}, failed gates {failed_gates}, "
                 f"{timeline.rel(decided.get('at'))} after the retrain started")  # fmt: skip
    shares = {url: (watch.now("split", url) or {}) for url in urls}
    canary = {url: sum(w for a, w in split.items() if a.lower() == "canary") for url, split in shares.items()}
    bounds.check("Canary's share 0 on every instance", all(v == 0 for v in canary.values()),
                 f"splits at the end {shares}")  # fmt: skip
    served = {seen.value for seen in watch.seen if seen.what == "serving" and seen.key.endswith(" Production")}
    figure = f"registry Production v{after['Production']} (was v{production}); instances served {sorted(served)}"
    bounds.check("Production untouched", after["Production"] == production and served == {production}, figure)
    by_candidate = [c for c in calls if c.outcome == "answered" and c.version == candidate]
    settled = decided.get("at", float("inf")) + settings.traffic.rules_ttl_s + 2
    late = [c for c in by_candidate if c.sent_at > settled]
    for url in urls:
        split = watch.first("split", url, lambda w: not any(a.lower() == "canary" and v for a, v in (w or {}).items()),
                            after=decided.get("at", float("inf")))  # fmt: skip
        timeline.mark(None if split is None else split.at, f"{url} applies the split {split and split.value}")
    timeline.mark(max((c.sent_at for c in by_candidate), default=None),
                  f"last call served by the candidate v{candidate} ({len(by_candidate)} in all)")  # fmt: skip
    bounds.check("no call served by the candidate after the rejection reached the rules caches", not late,
                 f"{len(late)} after decided + rules TTL + 2 s")  # fmt: skip
