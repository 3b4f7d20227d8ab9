"""`exa task map` and `exa task list`: the site's task map, in SQL, every change on the audit trail.

Thin: parse, call ``examlops.tasks.service``, format. Exit codes come from ``output.py``: 2 a name that
cannot be a task or a budget out of range; 3 SQL unavailable; 4 a model that is not in the catalog (nothing is changed).
Serving instances follow a remap within ``EXAMLOPS_TRAFFIC__RULES_TTL_S`` seconds, without a restart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from examlops.cli.output import (
    BAD_INPUT,
    JsonOption,
    console,
    err_console,
    errors_as_exit,
    fail,
    load_settings,
    print_json,
    print_table,
)

if TYPE_CHECKING:
    from examlops.tasks.routes import TaskRoute

task_app = typer.Typer(help="The task map: which model and alias answer each task.", no_args_is_help=True)


def _plain(route: TaskRoute) -> dict[str, Any]:
    return {
        "task": route.task,
        "model": route.model,
        "alias": route.alias,
        "adapter": route.adapter,
        "address": str(route.address),
        "changed_at": route.changed_at.isoformat() if route.changed_at else None,
        "budget_ms": route.budget_ms,
    }


def _budget(route: TaskRoute) -> str:
    return "-" if route.budget_ms is None else f"{route.budget_ms:g} ms"


@task_app.command("map")
def map_(
    task: Annotated[str, typer.Argument(help="The task, e.g. pavement.distress.jpcp (any case).")],
    model: Annotated[str, typer.Argument(help="Catalog model name (any case).")],
    alias: Annotated[
        str | None, typer.Option("--alias", help="Production, Canary or Staging; default: the model's default.")
    ] = None,
    budget_ms: Annotated[
        float | None,
        typer.Option(
            "--budget-ms",
            help="The task's default budget: a call to it that declares none gets this many milliseconds "
            "(HTTP and bus). Omitted: the task keeps its budget (a new one gets the catalog's, if any).",
            min=0.001,
        ),
    ] = None,
    no_budget: Annotated[bool, typer.Option("--no-budget", help="Clear the task's default budget.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Point a task at a model and alias (a new task gets its bus address) and set its default budget;
    audited as `task.mapped`. Serving and bridges follow within the rules TTL; callers change nothing.
    Needs the set_traffic permission."""
    from examlops.bootstrap import catalog
    from examlops.bootstrap.identity import acting_identity
    from examlops.bootstrap.tasks import task_map
    from examlops.identity import Permission
    from examlops.tasks.routes import KEEP, Keep
    from examlops.tasks.service import map_task

    if no_budget and budget_ms is not None:
        fail("give at most one of --budget-ms N and --no-budget", BAD_INPUT)
    budget: float | Keep | None = None if no_budget else KEEP if budget_ms is None else budget_ms
    settings = load_settings()
    with errors_as_exit(), task_map(settings) as tasks:
        actor = acting_identity(settings, Permission.SET_TRAFFIC)  # Forbidden without the permission
        done = map_task(
            tasks.map,
            catalog(settings),
            task,
            model,
            alias,
            actor=actor,
            audit=tasks.audit,
            budget_ms=budget,
            aliases=settings.hotset.aliases,
        )
    route, previous = done.change.route, done.change.previous
    if not done.audited:
        err_console.print(
            f"[yellow]warning:[/] the task was mapped but its audit event was not written: {done.audit_error}"
        )
    if as_json:
        print_json({**_plain(route), "previous": None if previous is None else _plain(previous)})
        return
    was = "new task" if previous is None else f"was {previous.model}@{previous.alias}"
    console.print(
        f"{route.task} -> {route.model}@{route.alias} ({was}); default budget {_budget(route)}; "
        f"bus address {route.address}",
        highlight=False,
    )


@task_app.command("list")
def list_(as_json: JsonOption = False) -> None:
    """Every mapped task: its model, alias, adapter, default budget, bus address and when it last changed."""
    from examlops.bootstrap.tasks import task_map

    settings = load_settings()
    with errors_as_exit(), task_map(settings) as tasks:
        routes = tasks.map.routes()
    if as_json:
        print_json([_plain(route) for route in routes])
        return
    if not routes:
        console.print("no task is mapped: `exa up` maps the catalog's tasks, `exa task map` maps one")
        return
    print_table(
        "task map",
        ["task", "model", "alias", "adapter", "budget", "bus address", "changed"],
        [
            [r.task, r.model, r.alias, r.adapter, _budget(r), r.address, f"{r.changed_at:%Y-%m-%d %H:%M:%S}"]
            for r in routes
        ],
    )
