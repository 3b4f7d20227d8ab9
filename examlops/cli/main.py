"""`exa`: the examlops command line. Thin: parse, call a service, format."""

from __future__ import annotations

import json
import os

import typer

from examlops.cli import lifecycle, promote
from examlops.cli.audit import audit_app
from examlops.cli.bridge_status import status as bridge_status
from examlops.cli.bus import bridge_app, bus_app
from examlops.cli.db import db_app
from examlops.cli.demo_traffic import demo_traffic
from examlops.cli.drift import drift_app
from examlops.cli.flows import flows_app
from examlops.cli.identity import identity_app
from examlops.cli.jobs import jobs_app
from examlops.cli.loop import canary_app, loop_app
from examlops.cli.output import JsonOption, console, err_console, errors_as_exit, load_settings, print_json
from examlops.cli.predict import predict
from examlops.cli.retrain import retrain
from examlops.cli.serve import serve_app
from examlops.cli.tasks import task_app
from examlops.cli.trace import trace_app
from examlops.core.setting_sources import setting_description, setting_sources

app = typer.Typer(
    name="exa",
    help="examlops: serve scikit-learn models by MLflow alias, record every bus inference, "
    "watch drift and retrain with Prefect.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Show the effective settings and where each came from.", no_args_is_help=True)
demo_app = typer.Typer(help="Demo models and data: register JPCP, CRCP and AC in MLflow.", no_args_is_help=True)

app.add_typer(config_app, name="config")
app.add_typer(demo_app, name="demo")
app.add_typer(serve_app, name="serve")
app.command(
    "predict", help="One prediction through the direct API (records nothing); with --stream, many from a file."
)(predict)
app.add_typer(bus_app, name="bus")
bridge_app.command("status")(bridge_status)
app.add_typer(bridge_app, name="bridge")
app.add_typer(audit_app, name="audit")
app.add_typer(db_app, name="db")
app.add_typer(task_app, name="task")
app.add_typer(drift_app, name="drift")
app.add_typer(flows_app, name="flows")
app.add_typer(trace_app, name="trace")
app.add_typer(identity_app, name="identity")
app.add_typer(jobs_app, name="jobs")
app.add_typer(loop_app, name="loop")
app.add_typer(canary_app, name="canary")
app.command("retrain", help="Train a candidate and compare it with Production; a better one goes to Canary.")(retrain)
demo_app.command("traffic")(demo_traffic)
lifecycle.register(app)
promote.register(app)


@app.callback()
def _process_environment() -> None:
    """Keep third-party state inside the state folder and telemetry off, for us and every child process."""
    # MLflow and Prefect write to the home folder and call home unless told otherwise; examlops
    # writes only under its state folder and runs offline.
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_HOME", str(load_settings().prefect_home))


@config_app.command("show")
def config_show(as_json: JsonOption = False) -> None:
    """Every setting: its effective value (derived ones too), where it came from and what it does."""
    from rich.table import Table

    settings = load_settings()
    rows = list(setting_sources(settings))
    if not settings.auth.enabled:  # on stderr with --json, so the JSON stays whole
        (err_console if as_json else console).print(
            "[bold red]AUTHENTICATION IS OFF[/] (EXAMLOPS_AUTH__ENABLED=false): every request acts as an admin, "
            "with no token. Development only.",
            highlight=False,
        )
    if as_json:
        print_json({name: {"value": value, "source": source} for name, value, source in rows})
        return
    table = Table(title="examlops settings (EXAMLOPS_<SECTION>__<NAME>)", title_justify="left")
    table.add_column("setting", overflow="fold")
    table.add_column("value", overflow="fold")  # a path or URL is shown whole, folded, never cut
    table.add_column("source")
    table.add_column("meaning")
    for name, value, source in rows:
        table.add_row(name, json.dumps(value), source, setting_description(name))
    console.print(table)


@demo_app.command("seed")
def demo_seed(as_json: JsonOption = False) -> None:
    """Register the demo models: two trained versions of each catalog model (Production -> 1, Canary -> 2)
    and a third that fails on purpose (Staging -> 3), so `exa demo traffic --fail-rate` can trip the retrain
    trigger. Running it again changes nothing; an alias you moved is never moved back. Each alias it points
    goes on the audit trail as your identity's move, so Redis must be up (exit 3 before anything is trained)."""
    from examlops.bootstrap import catalog, seed_demo_audited
    from examlops.bootstrap.identity import acting_identity

    settings = load_settings()
    with errors_as_exit():
        actor = acting_identity(settings)
        if as_json:
            report = seed_demo_audited(settings, catalog(settings), actor=actor)
        else:
            with console.status("seeding demo models") as status:
                report = seed_demo_audited(settings, catalog(settings), status.update, actor=actor)
    if as_json:
        print_json({"created": list(report.created), "skipped": list(report.skipped)})
        return
    for name in report.created:
        console.print(f"registered {name}: Production -> 1, Canary -> 2, Staging -> 3 (fails on purpose)")
    for name in report.skipped:
        console.print(f"{name} already has its demo aliases: left as it is")
    console.print(f"MLflow store: {settings.mlflow_tracking_uri}")


if __name__ == "__main__":
    app()
