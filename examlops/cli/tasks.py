"""`exa task map` and `exa task list`: the site's task map, in SQL, every change on the audit trail.

Thin: parse, call ``examlops.tasks.service``, format. Exit codes come from ``output.py``: 2 a name that
cannot be a task; 3 SQL unavailable; 4 a model that is not in the catalog (nothing is changed).
Serving instances follow a remap within ``EXAMLOPS_TRAFFIC__RULES_TTL_S`` seconds, without a restart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from examlops.cli.output import JsonOption, console, err_console, errors_as_exit, load_settings, print_json, print_table

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
    }


@task_app.command("map")
def map_(
    task: Annotated[str, typer.Argument(help="The task, e.g. pavement.distress.jpcp (any case).")],
    model: Annotated[str, typer.Argument(help="Catalog model name (any case).")],
    alias: Annotated[
        str | None, typer.Option("--alias", help="Production, Canary or Staging; default: the model's default.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Point a task at a model and alias (a new task gets its bus address); audited as `task.mapped`.
    Serving follows within the rules TTL; callers change nothing. Needs the set_traffic permission."""
    from examlops.bootstrap import catalog
    from examlops.bootstrap.identity import acting_identity
    from examlops.bootstrap.tasks import task_map
    from examlops.identity import Permission
    from examlops.tasks.service import map_task

    settings = load_settings()
    with errors_as_exit(), task_map(settings) as tasks:
        actor = acting_identity(settings, Permission.SET_TRAFFIC)  # Forbidden without the permission
        done = map_task(tasks.map, catalog(settings), task, model, alias, actor=actor, audit=tasks.audit)
    route, previous = done.change.route, done.change.previous
    if not done.audited:
        err_console.print(
            f"[yellow]warning:[/] the task was mapped but its audit event was not written: {done.audit_error}"
        )
    if as_json:
        print_json({**_plain(route), "previous": None if previous is None else _plain(previous)})
        return
    was = "new task" if previous is None else f"was {previous.model}@{previous.alias}"
    console.print(f"{route.task} -> {route.model}@{route.alias} ({was}); bus address {route.address}", highlight=False)


@task_app.command("list")
def list_(as_json: JsonOption = False) -> None:
    """Every mapped task: its model, alias, adapter, bus address and when it last changed."""
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
        ["task", "model", "alias", "adapter", "bus address", "changed"],
        [[r.task, r.model, r.alias, r.adapter, r.address, f"{r.changed_at:%Y-%m-%d %H:%M:%S}"] for r in routes],
    )
