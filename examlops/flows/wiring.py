"""What the control-plane flows share: Prefect's environment, artifact keys, the retrain event's name.

No Prefect import here: ``exa drift report`` and ``exa retrain`` use the same
pieces in process without paying for Prefect. ``prefect_environment`` is the
one place that points Prefect at the state folder and the configured API;
call it before the first ``import prefect`` (that import creates ``PREFECT_HOME``).

The adapters a flow uses are built by ``examlops.bootstrap.control.ControlPlane``.
"""

from __future__ import annotations

import os
import re

from examlops.core.settings import Settings

MODEL_RETRAINED = "model.retrained"


def artifact_key(prefix: str, model: str) -> str:
    """A Prefect artifact key (lower-case letters, digits and dashes only) for one model."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{prefix}-{model.lower()}")


def prefect_environment(settings: Settings, *, api: bool = True) -> None:
    """Point Prefect at ``settings``: its home in the state folder, the configured API, no telemetry.

    Values already in the environment win (``exa`` sets ``PREFECT_HOME`` for every command; a test harness
    sets its own API). ``api=False`` leaves ``PREFECT_API_URL`` alone.
    """
    os.environ.setdefault("PREFECT_HOME", str(settings.prefect_home))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    if api:
        os.environ.setdefault("PREFECT_API_URL", settings.prefect_api_url)
