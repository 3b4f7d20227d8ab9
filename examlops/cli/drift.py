"""`exa drift status|report` and `exa drift input status`: the drift reports from the shell.

Thin: parse, call ``examlops.monitoring`` (through ``examlops.bootstrap.control``), format. Evidently is
imported inside the commands. Exit codes come from ``output.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from examlops.cli.output import JsonOption, console, errors_as_exit, load_settings, print_json, print_table

if TYPE_CHECKING:
    from examlops.monitoring.drift_store import StatusRow


drift_app = typer.Typer(help="Drift of each model's bus traffic (Evidently, K-S p < 0.05).", no_args_is_help=True)
drift_input_app = typer.Typer(help="Drift of the input embeddings (norm, mean, std).", no_args_is_help=True)
drift_app.add_typer(drift_input_app, name="input")


def _status(kind: str, as_json: bool) -> None:
    from examlops.bootstrap import sql_engine
    from examlops.monitoring.drift_store import SqlDriftStore

    settings = load_settings()
    with errors_as_exit():
        rows = SqlDriftStore(sql_engine(settings)).latest(kind)
    if as_json:
        print_json([_status_json(row) for row in rows])
        return
    if not rows:
        console.print(
            "no drift report stored yet: one is stored when a model has enough new bus traffic for a window "
            "(30 snapshots by default); `exa drift report` runs one now and says what it found, the "
            "drift-report flow every 15 minutes"
        )
        return
    print_table(
        f"{kind} drift (latest report per model)",
        ["model", "version", "drifted", "score", "method", "window", "rows", "report", "when"],
        [
            [
                r.model,
                r.version,
                "DRIFT" if r.drifted else "no",
                f"{r.score:.4g}",
                f"{r.method} p<{r.threshold}",
                f"{r.window_start:%Y-%m-%d %H:%M:%S} .. {r.window_end:%H:%M:%S}",
                r.current_rows,
                r.report_html,
                f"{r.created_at:%Y-%m-%d %H:%M:%S}",
            ]
            for r in rows
        ],
    )


def _status_json(row: StatusRow) -> dict[str, Any]:
    return {
        "model": row.model, "kind": row.kind, "version": row.version, "drifted": row.drifted, "score": row.score,
        "method": row.method, "threshold": row.threshold, "columns": row.columns, "reference": row.reference,
        "reference_rows": row.reference_rows, "current_rows": row.current_rows,
        "window": {"start": row.window_start.isoformat(), "end": row.window_end.isoformat()},
        "report_html": row.report_html, "report_json": row.report_json, "created_at": row.created_at.isoformat(),
    }  # fmt: skip


@drift_app.command("status")
def drift_status(as_json: JsonOption = False) -> None:
    """Per model, prediction drift in the latest report: drifted or not, score (K-S p-value), window, report."""
    _status("prediction", as_json)


@drift_input_app.command("status")
def drift_input_status(as_json: JsonOption = False) -> None:
    """Per model, input-embedding drift (norm, mean, std; two of three columns) in the latest report."""
    _status("input", as_json)


@drift_app.command("report")
def drift_report(
    model: Annotated[str | None, typer.Argument(help="One model (any case); default: every model.")] = None,
    min_rows: Annotated[int, typer.Option("--min-rows", min=2, help="Report only windows this large.")] = 30,
    as_json: JsonOption = False,
) -> None:
    """Run the drift report now, in this process, over the snapshots since each model's last report."""
    from rich.progress import Progress

    from examlops.bootstrap.control import ControlPlane
    from examlops.monitoring.drift_report import run_drift_report

    plane = ControlPlane(load_settings())
    results: list[dict[str, Any]] = []
    with errors_as_exit():
        names = [plane.catalog.get(model).name] if model else list(plane.catalog.names)
        stages = ("reference", "snapshots", "evidently", "save")
        with Progress(console=console, transient=True, disable=as_json) as progress:
            bar = progress.add_task("drift report", total=len(names) * len(stages))
            for name in names:
                done = 0

                def step(stage: str, name: str = name) -> None:
                    nonlocal done
                    progress.update(bar, advance=1 if done else 0, description=f"{name}: {stage}")
                    done += 1

                report = run_drift_report(
                    name, plane.snapshots, plane.references, plane.drift_store, plane.drift_dir,
                    min_rows=min_rows, on_progress=step,
                )  # fmt: skip
                progress.update(bar, completed=(names.index(name) + 1) * len(stages))
                results.append(_report_json(name, report))
    if as_json:
        print_json(results)
        return
    print_table(
        "drift report",
        ["model", "prediction drift", "p", "input drift", "p", "snapshots", "report"],
        [
            [
                r["model"],
                _yes(r["prediction_drift"]),
                r.get("prediction_score"),
                _yes(r["input_drift"]),
                r.get("input_score"),
                r.get("rows"),
                r.get("report") or f"fewer than {min_rows} new snapshots",
            ]
            for r in results
        ],
    )


def _yes(value: bool | None) -> str:
    return "-" if value is None else ("DRIFT" if value else "no")


def _report_json(model: str, report: Any) -> dict[str, Any]:
    from examlops.flows.drift_report import report_row

    return report_row(model, report)
