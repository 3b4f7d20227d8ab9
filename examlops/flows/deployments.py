"""The deployments of ``prefect.yaml``, built into ``RunnerDeployment``s and served from one process.

``load_deployments(path)`` reads the file's ``deployments`` list: ``name``,
``entrypoint`` (``package.module:function``, or a ``path/to/file.py:function``
inside this package), optional ``description``, ``tags``, ``parameters`` and
``schedules`` (each a ``cron`` with ``timezone`` and ``active``, or an
``interval`` in seconds). Anything it cannot use raises ``ConfigError`` naming
the file and the deployment. ``serve(path)`` serves them all with
``prefect.serve``: it blocks, and pauses the schedules when it is stopped
(SIGTERM or SIGINT).

Import this module only after ``wiring.prefect_environment``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import yaml
from prefect.deployments.runner import RunnerDeployment
from prefect.flows import Flow
from prefect.schedules import Cron, Interval, Schedule
from prefect.types.entrypoint import EntrypointType

from examlops.core.errors import ConfigError

FILE_NAME = "prefect.yaml"


def default_path() -> Path:
    """``prefect.yaml`` in the working directory if there is one, else the one beside the examlops package."""
    here = Path.cwd() / FILE_NAME
    return here if here.is_file() else Path(__file__).resolve().parents[2] / FILE_NAME


def _flow(entrypoint: str) -> Flow[..., Any]:
    target, _, name = entrypoint.rpartition(":")
    module = target.removesuffix(".py").replace("/", ".") if target.endswith(".py") else target
    try:
        candidate = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"entrypoint {entrypoint!r} cannot be imported: {exc}") from exc
    if not isinstance(candidate, Flow):
        raise ConfigError(f"entrypoint {entrypoint!r} is not a Prefect flow")
    return candidate


def _schedule(raw: dict[str, Any]) -> Schedule:
    active = bool(raw.get("active", True))
    if "cron" in raw:
        return Cron(str(raw["cron"]), timezone=raw.get("timezone"), active=active)
    if "interval" in raw:
        return Interval(float(raw["interval"]), timezone=raw.get("timezone"), active=active)
    raise ConfigError(f"a schedule needs a cron or an interval, got {sorted(raw)}")


def load_deployments(path: Path) -> list[RunnerDeployment]:
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot be read: {exc}") from exc
    entries = (document or {}).get("deployments") or []
    deployments = []
    for entry in entries:
        where = f"{path}: deployment {entry.get('name', '?')!r}"
        try:
            flow = _flow(str(entry["entrypoint"]))
            deployment = flow.to_deployment(
                name=str(entry["name"]),
                description=entry.get("description"),
                tags=list(entry.get("tags") or []),
                parameters=dict(entry.get("parameters") or {}),
                schedules=[_schedule(s) for s in entry.get("schedules") or []],
                # A module path, not a file path: the runner imports the flow wherever it was started.
                entrypoint_type=EntrypointType.MODULE_PATH,
            )
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {type(exc).__name__}: {exc}") from exc
        # to_deployment is sync here (no running event loop), so never the coroutine its type allows.
        assert isinstance(deployment, RunnerDeployment)
        deployments.append(deployment)
    if not deployments:
        raise ConfigError(f"{path}: no deployments to serve")
    return deployments


def serve(path: Path) -> None:
    """Serve every deployment of ``path`` until stopped (see the module docstring)."""
    from prefect import serve as prefect_serve

    prefect_serve(*load_deployments(path), print_starting_message=True)
