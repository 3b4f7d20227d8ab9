"""`exa loop status` and `exa canary start | abort`: where each model's closed loop stands, and its canary.

Thin: parse, call ``examlops.loop`` through ``examlops.bootstrap.loop`` (or start a run of the
canary-analysis deployment), format. Exit codes from ``output.py``: 2 bad input (nothing to analyse: the
model's registry state cannot be acted on as asked), 3 a dependency down (Prefect, SQL, Redis, MLflow),
4 no such model or nothing to abort, 1 a live loop already holds the model (checked before a run starts).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from examlops.cli.output import JsonOption, console, errors_as_exit, fail, load_settings, print_json, print_table
from examlops.core.settings import Settings

loop_app = typer.Typer(help="The closed loop: retrain, canary analysis, promotion or rollback, per model.",
                       no_args_is_help=True)  # fmt: skip
canary_app = typer.Typer(
    help="Canary analysis: send a share of the traffic to Canary, compare it with Production, then promote it "
    "or set its share to 0.",
    no_args_is_help=True,
)
ModelArgument = Annotated[str, typer.Argument(help="Catalog model name (any case).")]


@loop_app.command("status")
def status(
    model: Annotated[str | None, typer.Argument(help="One model; default: every catalog model.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Per model: where the loop stands (serving, retraining, canary at N % with its figures so far, promoted,
    rejected, rolled back, undecided, aborted), since when, and what it last said."""
    from examlops.bootstrap import catalog
    from examlops.bootstrap.loop import loop_store

    settings = load_settings()
    with errors_as_exit():
        names = [catalog(settings).get(model).name] if model else [spec.name for spec in catalog(settings)]
        with loop_store(settings) as store:
            records = {record.model: record for record in store.list()}
    now = time.time()
    rows: list[dict[str, Any]] = []
    for name in names:
        record = records.get(name)
        if record is None:
            rows.append({"model": name, "phase": "serving", "note": "no loop has run"})
            continue
        row = record.to_json()
        row["active"] = record.phase.active
        row["stale"] = record.stale(now, settings.loop.lease_s)
        if record.promoted_at is not None:
            row["grace_left_s"] = round(max(0.0, record.promoted_at + settings.loop.grace_s - now), 1)
        rows.append(row)
    if as_json:
        print_json(rows if model is None else rows[0])
        return
    print_table("closed loop", ["model", "phase", "versions", "figures so far", "since", "note"],
                [_status_row(row, now) for row in rows])  # fmt: skip


def _status_row(row: dict[str, Any], now: float) -> list[str]:
    phase = row["phase"]
    if phase == "canary" and row.get("share"):
        phase = f"canary at {row['share']} %"
    if row.get("stale"):
        phase += " (no sign of life)"
    versions = ""
    if row.get("production_version") or row.get("canary_version"):
        versions = f"Production v{row.get('production_version') or '-'}, Canary v{row.get('canary_version') or '-'}"
    figures = row.get("figures") or {}
    shown = ""
    if figures.get("canary"):
        canary, production = figures["canary"], figures["production"]
        shown = (
            f"Canary {canary['requests']} calls, fail {canary['failure_rate']:.3f}, p99 {_ms(canary['p99_ms'])}; "
            f"Production {production['requests']} calls, fail {production['failure_rate']:.3f}, "
            f"p99 {_ms(production['p99_ms'])}"
        )
    # An active phase is updated as it goes (its figures, its lease): it began when its run did.
    at = row.get("started_at") if row.get("active") else row.get("updated_at")
    since = f"{now - at:.0f} s ago" if at else "-"
    note = row.get("note", "")
    if row.get("grace_left_s"):
        note += f" (grace {row['grace_left_s']:.0f} s left)"
    return [row["model"], phase, versions, shown, since, note]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


@canary_app.command("start")
def start(
    model: ModelArgument,
    share: Annotated[
        int | None,
        typer.Option("--share", min=1, max=50, help="Percent to Canary; default EXAMLOPS_LOOP__CANARY_SHARE."),
    ] = None,
    here: Annotated[
        bool, typer.Option("--here", help="Run the analysis in this process instead of a run of its deployment.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Start a canary analysis of MODEL's Canary against its Production: a run of the canary-analysis
    deployment (needs `exa up`), or with --here in this process until it decides. Refused before any run
    starts when MODEL is not in the catalog (exit 4) or there is nothing to analyse: Canary unset, or on
    Production's version (exit 2)."""
    from examlops.bootstrap import catalog
    from examlops.bootstrap.identity import acting_identity
    from examlops.bootstrap.loop import model_versions, refuse_if_held
    from examlops.identity import Permission
    from examlops.loop.analysis import versions_to_analyse

    settings = load_settings()
    with errors_as_exit():
        actor = acting_identity(settings, Permission.PROMOTE)
        name = catalog(settings).get(model).name
        # A run started regardless would only fail in Prefect, where `exa loop status` does not show it.
        versions_to_analyse(model_versions(settings), name)
        refuse_if_held(settings, name)
    if not here:
        _start_via_prefect(settings, name, share, as_json)
        return
    import uuid

    from examlops.bootstrap.loop import closed_loop
    from examlops.flows.canary import run_canary
    from examlops.loop.report import gate_rows, side_by_side

    owner = f"cli-{uuid.uuid4().hex[:12]}"
    with (
        errors_as_exit(),
        console.status(f"canary analysis of {name}") as shown,
        closed_loop(settings, actor=actor, say=shown.update) as parts,
    ):
        result = run_canary(settings, parts, name, owner=owner, run=f"exa canary start by {actor}", share=share)
    if as_json:
        print_json(result.to_json())
        return
    print_table(f"{result.model}: {result.decision}", ["gate", "verdict", "canary", "production", "limit", "detail"],
                [list(row.values()) for row in gate_rows(result)])  # fmt: skip
    console.print(side_by_side(result), highlight=False, markup=False)


def _start_via_prefect(settings: Settings, name: str, share: int | None, as_json: bool) -> None:
    from examlops.cli.deployments import start_run

    follow = f"follow it with `exa loop status {name}`"
    start_run(settings, "canary-analysis/canary-analysis", {"model": name, "share": share},
              what=f"canary analysis of {name}", as_json=as_json, follow=follow)  # fmt: skip


@canary_app.command("abort")
def abort(
    model: ModelArgument,
    wait: Annotated[float, typer.Option("--wait", min=0, help="Seconds to wait for the run to stop.")] = 30.0,
    as_json: JsonOption = False,
) -> None:
    """Stop MODEL's canary analysis: its run puts the split back and ends as aborted (a run that died is
    ended here). Waits until the record says so, at most --wait seconds."""
    from examlops.bootstrap import catalog
    from examlops.bootstrap.identity import acting_identity
    from examlops.bootstrap.loop import closed_loop
    from examlops.identity import Permission
    from examlops.loop.abort import abort_analysis

    settings = load_settings()
    with errors_as_exit():
        actor = acting_identity(settings, Permission.PROMOTE)
        name = catalog(settings).get(model).name
        with closed_loop(settings, actor=actor) as parts:
            result = abort_analysis(parts, name, actor=actor)
            record = result.record
            deadline = time.monotonic() + wait
            while record.phase.active and time.monotonic() < deadline:
                time.sleep(0.5)
                record = parts.store.get(name) or record
    if as_json:
        print_json({"how": result.how, **record.to_json()})
        return
    if record.phase.active:
        fail(f"{name}: asked its run ({record.run}) to stop; it has not yet after {wait:g} s", 1)
    console.print(f"{name}: {record.phase.value}: {record.note}", highlight=False)
