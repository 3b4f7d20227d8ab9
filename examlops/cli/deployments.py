"""Starting a run of one of the control plane's Prefect deployments from the CLI (`exa retrain --via-prefect`,
`exa canary start`): ``start_run`` starts it without waiting and prints its name and UI address (or JSON).

A Prefect that cannot be reached, or has no such deployment (`exa up` serves them), exits with code 3.
"""

from __future__ import annotations

import asyncio
from typing import Any

from examlops.cli.output import console, fail, print_json
from examlops.core.settings import Settings


def start_run(settings: Settings, deployment: str, parameters: dict[str, Any], *, what: str, as_json: bool,
              follow: str = "") -> None:  # fmt: skip
    """Start a run of ``deployment`` with ``parameters``; ``what`` names it in messages, ``follow`` is a hint
    printed after it (e.g. the status command to watch it with)."""
    from examlops.flows.wiring import prefect_environment

    prefect_environment(settings)
    from prefect.deployments import run_deployment

    try:
        run = run_deployment(deployment, parameters=parameters, timeout=0, as_subflow=False)
    except Exception as exc:  # httpx errors, ObjectNotFound: Prefect or the deployment is not there
        fail(f"Prefect at {settings.prefect_api_url} did not start {what}: {type(exc).__name__}: {exc}", 3)
    assert not asyncio.iscoroutine(run)  # run_deployment is sync outside an event loop
    url = f"{settings.prefect_api_url.removesuffix('/api')}/runs/flow-run/{run.id}"
    if as_json:
        print_json({"flow_run_id": str(run.id), "name": run.name, "url": url})
        return
    console.print(f"{what} started: flow run {run.name} at {url}" + (f"; {follow}" if follow else ""),
                  highlight=False)  # fmt: skip
