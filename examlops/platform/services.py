"""What ``exa up`` runs: one ``ServiceSpec`` per service, built from the settings.

A service is *owned* when no setting points elsewhere; then it has a
``process`` to start. An external service (``EXAMLOPS_REDIS__URL``,
``EXAMLOPS_PREFECT__API_URL``, an ``http(s)`` ``EXAMLOPS_MLFLOW__TRACKING_URI``)
has none: it is listed with its URL and never started or stopped by us.

Programs are launched from the venv's bin (``Path(sys.executable).parent``) as
subprocesses, so neither mlflow nor prefect is imported here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from examlops.core import keys
from examlops.core.settings import Settings
from examlops.platform.process import ManagedProcess
from examlops.platform.redis_server import EmbeddedRedis

SERVICE_NAMES = ("redis", "mlflow", "prefect", "serving", "bridge", "flows")
"""Start order; they are stopped in reverse."""

NEEDS: dict[str, tuple[str, ...]] = {
    "redis": (),
    "mlflow": (),
    "prefect": (),
    "serving": ("redis",),
    "bridge": ("redis", "serving"),
    "flows": ("prefect", "redis"),
}
"""What each service needs ready before it starts (`exa up` starts them in waves by this, after Redis and the
setup hook). Serving does not need the MLflow server: it reads the registry's store itself (SQLite by default;
an MLflow server over HTTP is external, never ours)."""

LOCALHOST = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """One service: where it answers and, when owned, the process that provides it."""

    name: str
    title: str
    url: str
    """Shown to the user; credentials are masked."""
    links: tuple[tuple[str, str], ...] = ()
    """Further (title, URL) pairs for the table, such as the OpenAPI docs."""
    process: ManagedProcess | None = None
    """None for an external service."""
    port: int | None = None
    port_setting: str = ""
    health_url: str | None = None
    """What ``exa status`` probes; None when probing would need a secret."""
    essential: bool = True
    """False for a service that only serves a UI: when it keeps failing, the platform goes on without it."""

    @property
    def needs(self) -> tuple[str, ...]:
        return NEEDS.get(self.name, ())

    @property
    def owned(self) -> bool:
        return self.process is not None


def redact(url: str) -> str:
    """The URL with any password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _bin(program: str) -> str:
    beside_python = Path(sys.executable).parent / program
    return str(beside_python) if beside_python.exists() else program


def _external(name: str, title: str, url: str, health: str | None) -> ServiceSpec:
    shown = redact(url)
    return ServiceSpec(name, title, shown, health_url=health if shown == url else None)


def redis_spec(settings: Settings) -> ServiceSpec:
    if not settings.redis_owned:
        return _external("redis", "Redis", settings.redis_url, settings.redis_url)
    server = EmbeddedRedis(
        settings.state_dir / "redis", settings.redis.port, log_path=settings.log_dir / "redis.log", logs=settings.logs
    )
    return ServiceSpec(
        "redis", "Redis", server.url, process=server.process, port=server.port,
        port_setting="EXAMLOPS_REDIS__PORT", health_url=server.url,
    )  # fmt: skip


def mlflow_spec(settings: Settings) -> ServiceSpec:
    tracking = settings.mlflow_tracking_uri
    if urlsplit(tracking).scheme in ("http", "https"):
        return _external("mlflow", "MLflow UI", tracking, tracking.rstrip("/") + "/health")
    port = settings.mlflow.ui_port
    url = f"http://{LOCALHOST}:{port}"
    artifacts = settings.mlflow_artifact_root
    argv = [
        _bin("mlflow"), "server",
        "--backend-store-uri", tracking,
        "--default-artifact-root", str(artifacts),
        "--artifacts-destination", str(artifacts),
        "--host", LOCALHOST, "--port", str(port),
        "--workers", "1",
    ]  # fmt: skip
    process = ManagedProcess(
        "mlflow",
        argv,
        log_path=settings.log_dir / "mlflow.log",
        logs=settings.logs,
        health=f"{url}/health",
        # Without this, the server forks a pool of job workers (about 15 processes, 2 GB).
        env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        cwd=settings.mlflow_dir,  # anything it writes relative to the cwd stays in the state folder
        prepare=lambda: artifacts.mkdir(parents=True, exist_ok=True),
    )
    return ServiceSpec(
        "mlflow", "MLflow UI", url, process=process, port=port,
        port_setting="EXAMLOPS_MLFLOW__UI_PORT", health_url=f"{url}/health", essential=False,
    )  # fmt: skip


def prefect_spec(settings: Settings) -> ServiceSpec:
    api = settings.prefect_api_url.rstrip("/")
    ui = api.removesuffix("/api")
    if settings.prefect.api_url is not None:
        return _external("prefect", "Prefect UI", ui, f"{api}/health")
    port = settings.prefect.port
    home = settings.prefect_home
    env = {
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # `--port` alone leaves the bundled UI calling port 4200; these set what the UI is told.
        "PREFECT_SERVER_API_HOST": LOCALHOST,
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_API_URL": api,
    }
    process = ManagedProcess(
        "prefect",
        [_bin("prefect"), "server", "start", "--host", LOCALHOST, "--port", str(port)],
        log_path=settings.log_dir / "prefect.log",
        logs=settings.logs,
        health=f"{api}/health",
        env=env,
        cwd=home,
        prepare=lambda: home.mkdir(parents=True, exist_ok=True),
    )
    return ServiceSpec(
        "prefect", "Prefect UI", ui, process=process, port=port,
        port_setting="EXAMLOPS_PREFECT__PORT", health_url=f"{api}/health",
    )  # fmt: skip


def serving_spec(settings: Settings) -> ServiceSpec:
    host, port = settings.serving.host, settings.serving.port
    url = settings.serving.local_url
    process = ManagedProcess(
        "serving",
        [sys.executable, "-m", "examlops.cli.main", "serve", "start", "--host", host, "--port", str(port)],
        log_path=settings.log_dir / "serving.log",
        logs=settings.logs,
        health=f"{url}/readyz",
        # The child reads its own Settings from the environment; this keeps it on our state folder.
        env={"EXAMLOPS_HOME": str(settings.state_dir)},
        cwd=settings.state_dir,
        stop_grace=settings.serving.drain_grace_s + 5,  # it drains requests in flight on SIGTERM
    )
    return ServiceSpec(
        "serving", "Serving API", url, links=(("OpenAPI docs", f"{url}/docs"), ("Dashboard", f"{url}/dashboard")),
        process=process,
        port=port, port_setting="EXAMLOPS_SERVING__PORT", health_url=f"{url}/readyz",
    )  # fmt: skip


def _bridge_heartbeat(redis_url: str, started_at: Callable[[], float]) -> Callable[[], bool]:
    """Ready once some bridge has beaten since this process (re)started."""

    def check() -> bool:
        import redis

        client = redis.Redis.from_url(redis_url, socket_connect_timeout=1.0, socket_timeout=1.0)
        try:
            beats = client.hvals(keys.BUS_HANDLERS)
        except redis.RedisError:
            return False
        finally:
            client.close()
        return any(float(beat) >= started_at() for beat in beats)

    return check


def bridge_spec(settings: Settings) -> ServiceSpec:
    """`exa bridge start`: one handler per catalog UUID; ready once it has announced them in Redis."""
    process = ManagedProcess(
        "bridge",
        [sys.executable, "-m", "examlops.cli.main", "bridge", "start"],
        log_path=settings.log_dir / "bridge.log",
        logs=settings.logs,
        health=lambda: False,  # replaced below: the check needs the process's start time
        env={"EXAMLOPS_HOME": str(settings.state_dir)},
        cwd=settings.state_dir,
        stop_grace=settings.http.connect_timeout_s + settings.http.read_timeout_s + 5,
    )
    process.health = _bridge_heartbeat(settings.redis_url, lambda: process.started_at)
    return ServiceSpec("bridge", "Bus bridge", redact(settings.redis_url), process=process)


FLOWS_DEPLOYMENTS = (
    "drift-report/drift-report",
    "retrain/retrain",
    "canary-analysis/canary-analysis",
    "promote/promote",
    "retention/retention",
)
"""What ``exa flows serve`` must have registered before the flows service counts as ready."""


def _deployments_exist(api: str, names: tuple[str, ...]) -> Callable[[], bool]:
    def check() -> bool:
        import httpx  # a local import keeps `exa --help` fast

        with httpx.Client(base_url=api, timeout=2.0) as client:
            return all(client.get(f"/deployments/name/{name}").status_code == 200 for name in names)

    return check


def flows_spec(settings: Settings) -> ServiceSpec:
    """`exa flows serve`: serves the deployments of prefect.yaml against the Prefect API (ours or external).

    It waits for the API itself, so it may start beside Prefect; it is ready once every deployment is
    registered. Prefect's runner stops on SIGTERM: it cancels runs in flight and pauses the schedules.
    """
    api = settings.prefect_api_url.rstrip("/")
    process = ManagedProcess(
        "flows",
        [sys.executable, "-m", "examlops.cli.main", "flows", "serve"],
        log_path=settings.log_dir / "flows.log",
        logs=settings.logs,
        health=_deployments_exist(api, FLOWS_DEPLOYMENTS),
        env={
            "EXAMLOPS_HOME": str(settings.state_dir),
            "PREFECT_HOME": str(settings.prefect_home),
            "PREFECT_API_URL": api,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        },
        cwd=settings.state_dir,
        stop_grace=20.0,
    )
    return ServiceSpec("flows", "Prefect flows (served)", f"{api.removesuffix('/api')}/deployments", process=process)


_BUILDERS = {
    "redis": redis_spec,
    "mlflow": mlflow_spec,
    "prefect": prefect_spec,
    "serving": serving_spec,
    "bridge": bridge_spec,
    "flows": flows_spec,
}


def build_specs(settings: Settings, services: Collection[str] | None = None) -> list[ServiceSpec]:
    """Specs for ``services`` (default: all) in start order. ``ValueError`` for an unknown name."""
    wanted = SERVICE_NAMES if services is None else tuple(services)
    unknown = sorted(set(wanted) - set(SERVICE_NAMES))
    if unknown:
        raise ValueError(f"unknown service(s) {', '.join(unknown)}; known: {', '.join(SERVICE_NAMES)}")
    return [_BUILDERS[name](settings) for name in SERVICE_NAMES if name in wanted]
