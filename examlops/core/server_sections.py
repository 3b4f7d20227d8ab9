"""The settings sections that say where the shared servers are: Redis, MLflow, Prefect and a Ray cluster.

Unset URLs mean examlops starts and owns a local server under the state folder. Same rules as
``setting_sections``: frozen, unknown keys refused, each field's docstring is what `exa config show` prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from examlops.core.setting_sections import Section


class RedisSettings(Section):
    """The Redis server that carries the bus, snapshots and audit trail."""

    url: str | None = None
    """URL of an external Redis; unset, examlops starts and owns a redis-server."""
    port: int = Field(18004, ge=1, le=65535)
    """Port of the embedded redis-server on 127.0.0.1."""


class MlflowSettings(Section):
    """The MLflow registry and its UI."""

    tracking_uri: str | None = None
    """MLflow tracking and registry URI; unset, a SQLite store in the state folder."""
    ui_port: int = Field(18002, ge=1, le=65535)
    """Port of the embedded `mlflow server` (the UI)."""
    timeout_s: int = Field(5, ge=1, le=600)
    """Seconds one HTTP request to an MLflow server may take (connect or read); MLflow's own default is 120."""
    max_retries: int = Field(1, ge=0, le=10)
    """Retries of one failed HTTP request to an MLflow server, about a second apart; MLflow's own default is 7,
    with backoff that adds up to minutes. A call then fails within about (max_retries + 1) x timeout_s + 2 s."""


class PrefectSettings(Section):
    """The Prefect server that runs the control-plane flows."""

    api_url: str | None = None
    """URL of an external Prefect API; unset, examlops starts and owns a Prefect server."""
    port: int = Field(18003, ge=1, le=65535)
    """Port of the embedded Prefect server and its UI."""


class RaySettings(Section):
    """The Ray Serve engine (``serving.engine=ray``): the cluster and each model deployment's replicas."""

    address: str | None = None
    """A running Ray cluster to join (``ray://`` or ``host:port``); unset, serving starts a local one."""
    num_cpus: int | None = Field(None, ge=1)
    """CPUs of the local cluster serving starts; unset, the machine's."""
    temp_dir: Path | None = None
    """Ray's session, socket and log folder; unset, ``ray`` under the state folder. Ray's socket paths must
    stay under 108 bytes: serving refuses to start when this folder's path is longer than 43 characters."""
    num_replicas: int = Field(1, ge=1)
    """Replicas of each model deployment when ``max_replicas`` is unset (no autoscaling)."""
    min_replicas: int = 1
    """With ``max_replicas`` set: the fewest replicas autoscaling keeps per model; at least 1 (no scaling to
    zero: a version counts as loaded once running replicas confirm it, and a request must not wait for a
    cold replica to load every version within the predict limit)."""
    max_replicas: int | None = Field(None, ge=1)
    """Set, each model deployment autoscales between ``min_replicas`` and this."""
    target_ongoing_requests: float = Field(2.0, gt=0)
    """Autoscaling's target of calls in flight per replica (each call is one micro-batch of rows)."""
    max_ongoing_requests: int = Field(64, ge=1)
    """Calls one model replica accepts at once; more wait in the ingress's handle."""
    replica_cpus: float = Field(0.5, gt=0)
    """CPUs reserved per model replica (Ray's ``num_cpus``); the ingress reserves a quarter CPU."""
    deploy_timeout_s: float = Field(120.0, gt=0)
    """How long a model deployment may take to have every replica running its versions; past it the load
    fails with Ray's status message (e.g. replicas that the cluster has no CPUs to place)."""
    proxy_location: Literal["HeadOnly", "EveryNode"] = "HeadOnly"
    """Where Serve runs its HTTP proxy: the head node only, or every node (then each node answers on the
    serving port and a balancer can spread over them)."""

    @model_validator(mode="after")
    def _min_below_max(self) -> RaySettings:
        if self.min_replicas < 1:
            # A version counts as loaded once running replicas confirm it: with none, no version could load.
            raise ValueError(
                f"ray.min_replicas={self.min_replicas}: a model never scales to zero; set EXAMLOPS_RAY__MIN_REPLICAS=1"
            )
        if self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError("ray.min_replicas must not exceed ray.max_replicas")
        return self
