"""What the control-plane flows and their CLI twins are built from: real adapters chosen from the settings.

No Prefect import here: ``exa drift report`` and ``exa retrain`` use the same
pieces in process without paying for Prefect. ``prefect_environment`` is the
one place that points Prefect at the state folder and the configured API;
call it before the first ``import prefect`` (that import creates ``PREFECT_HOME``).

These builders would sit in ``examlops.bootstrap``; they live here until it
grows them, and build everything through it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from examlops import bootstrap
from examlops.core.settings import Settings
from examlops.monitoring.drift import ProjectedSnapshotReader, TrainingReference
from examlops.monitoring.drift_store import SqlDriftStore
from examlops.monitoring.snapshots import SnapshotStream
from examlops.registry.catalog import Catalog
from examlops.registry.mlflow_registry import MlflowRegistry

AuditHook = Callable[[str, str, Mapping[str, Any]], None]
"""``(event type, subject, data)``: appends one event to the audit trail; raises ``StoreUnavailable``."""

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


@dataclass
class ControlPlane:
    """Adapters of one flow run or CLI command; each is built on first use."""

    settings: Settings

    @cached_property
    def catalog(self) -> Catalog:
        return bootstrap.catalog(self.settings)

    @cached_property
    def registry(self) -> MlflowRegistry:
        return bootstrap.model_registry(self.settings)

    @cached_property
    def snapshots(self) -> ProjectedSnapshotReader:
        from examlops.adapters.redis import connect

        return ProjectedSnapshotReader(SnapshotStream(connect(self.settings.redis_url, socket_timeout_s=30.0)))

    @cached_property
    def drift_store(self) -> SqlDriftStore:
        return SqlDriftStore(bootstrap.sql_engine(self.settings))

    @cached_property
    def references(self) -> TrainingReference:
        return TrainingReference(self.registry, self.catalog, self.drift_dir / "references")

    @property
    def drift_dir(self) -> Path:
        return self.settings.state_dir / "drift"

    @cached_property
    def audit(self) -> AuditHook:
        """Appends to the hash-chained audit trail in Redis and signs each event at once: a flow's process
        is short-lived, so it leaves no unsigned event behind."""
        return bootstrap.control_events(self.settings, bootstrap.sql_engine(self.settings))
