"""`exa flows serve`: the Prefect control plane, the deployments of prefect.yaml served until Ctrl-C.

Thin: wait for the Prefect API, hand prefect.yaml to ``examlops.flows.deployments``. Prefect is imported
inside the command. A Prefect API that does not answer within ``--wait`` is ``DependencyUnavailable``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from examlops.cli.output import console, errors_as_exit, load_settings

flows_app = typer.Typer(help="The Prefect control plane: the deployments of prefect.yaml.", no_args_is_help=True)


@flows_app.command("serve")
def flows_serve(
    file: Annotated[
        Path | None, typer.Option("--file", help="The prefect.yaml to serve; default: ./prefect.yaml or the repo's.")
    ] = None,
    wait: Annotated[float, typer.Option("--wait", min=0, help="Seconds to wait for the Prefect API to answer.")] = 120,
) -> None:
    """Serve every deployment of prefect.yaml until Ctrl-C: drift-report and retention on their schedules;
    retrain, canary-analysis and promote when asked.

    Runs against EXAMLOPS_PREFECT__API_URL, or the Prefect server `exa up` starts."""
    from examlops.flows.wiring import prefect_environment

    settings = load_settings()
    prefect_environment(settings)
    from examlops.flows import deployments

    path = file or deployments.default_path()
    with errors_as_exit():
        loaded = deployments.load_deployments(path)
        _wait_for_prefect(settings.prefect_api_url, wait)
    console.print(f"serving {len(loaded)} deployment(s) of {path} at {settings.prefect_api_url}")
    deployments.serve(path)


def _wait_for_prefect(api_url: str, wait_s: float) -> None:
    """Return once the API answers (exa up starts us beside Prefect); ``DependencyUnavailable`` after ``wait_s``."""
    import time

    import httpx

    from examlops.core.errors import DependencyUnavailable

    deadline = time.monotonic() + wait_s
    while True:
        try:
            if httpx.get(api_url.rstrip("/") + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() >= deadline:
            raise DependencyUnavailable(f"the Prefect API at {api_url} did not answer within {wait_s:g} s")
        time.sleep(0.5)
