"""`exa status`: each service of `exa up`, its state, pid, URL and health, as a table or as JSON.

Thin: reads ``examlops.platform`` (the state file ``UpState``, the supervisor's lock, each service's
health probe, all probed at once), formats. ``status_document`` is the JSON document (`exa up --detach
--json` prints it too): ``running`` is the supervisor's lock, not its pid; a service is ``running``,
``starting``, ``restarting`` (it exited on its own and the supervisor starts it again), ``failed`` (it kept
failing and was left stopped: only a UI-only one, the rest would have stopped the platform), ``unhealthy``,
``stopped``, or, when `exa up` did not start it, ``external`` or ``unreachable``; ``restarts`` and
``last_exit`` say how often it was restarted and how it last ended. Exit codes from ``output.py``: 0 when
everything that should run does, 1 otherwise. Nothing heavy is imported at module level, so `exa --help` stays fast.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from examlops.cli.output import OK, UNWELL, console, load_settings, nothing_running, print_json, print_table

if TYPE_CHECKING:
    from examlops.platform.up_state import UpState


def _service_status(record: Any, supervisor_up: bool) -> dict[str, Any]:
    from examlops.platform.leftovers import ours, running
    from examlops.platform.process import probe

    healthy = probe(record.health_url) if record.health_url else None
    if not record.owned:
        state = "external" if healthy is not False else "unreachable"
    elif supervisor_up and record.state in ("restarting", "failed"):
        state = record.state  # the supervisor's word: the pid on file is the one that exited
    elif record.pid is None or not running(record.pid):
        # It died since the supervisor last looked: its next look (within a second) restarts it.
        state = "restarting" if supervisor_up and record.state in ("starting", "running", "unhealthy") else "stopped"
    elif not supervisor_up and record.pgid is not None and not ours(record.pgid, record.stamp):
        state = "stopped"  # its pid belongs to another process now
    elif supervisor_up and record.state == "starting":
        state = "starting"  # the supervisor's word until it has seen it ready, even when a probe answers first
    elif healthy is False:
        state = "unhealthy"
    else:
        state = "running"
    return {
        "name": record.name,
        "title": record.title,
        "state": state,
        "healthy": healthy,
        "url": record.url,
        "links": dict(record.links),
        "pid": record.pid,
        "pgid": record.pgid,
        "log": record.log,
        "owned": record.owned,
        "restarts": record.restarts,
        "last_exit": record.last_exit,
    }


def status_document(state: UpState | None, run_dir: Path) -> dict[str, Any]:
    from examlops.platform.up_state import supervisor_running

    up = supervisor_running(run_dir)
    if state is None:
        return {"running": up, "state": None, "supervisor_pid": None, "services": []}
    with ThreadPoolExecutor(max_workers=max(1, len(state.services))) as pool:
        services = list(pool.map(lambda r: _service_status(r, up), state.services))
    return {
        "running": up,
        "state": state.state if up else "dead",
        "supervisor_pid": state.supervisor_pid,
        "state_dir": state.state_dir,
        "started_at": state.started_at,
        "services": services,
    }


def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Each service of `exa up`: state, pid, URL, health. Exit 1 when something that should run does not."""
    from examlops.platform.up_state import UpState

    settings = load_settings()
    doc = status_document(UpState.read(settings.run_dir), settings.run_dir)
    well = doc["running"] and all(s["state"] in ("running", "external") for s in doc["services"])
    if as_json:
        print_json({**doc, "ok": well})
    elif not doc["services"]:
        console.print(nothing_running(settings))
    else:
        rows = []
        for s in doc["services"]:
            health = {True: "ok", False: "failing", None: "-"}[s["healthy"]]
            restarts = f"{s['restarts']} (last exit {s['last_exit']})" if s["restarts"] else "-"
            rows.append([s["title"], s["state"], str(s["pid"] or "-"), s["url"], health, restarts])
        title = f"exa up (pid {doc['supervisor_pid']}): {doc['state']}"
        if doc["running"] and not well:
            title += f"; {sum(s['state'] not in ('running', 'external') for s in doc['services'])} service(s) not well"
        print_table(title, ("service", "state", "pid", "URL", "health", "restarts"), rows)
    raise typer.Exit(OK if well else UNWELL)
