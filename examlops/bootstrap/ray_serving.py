"""The serving assembly on Ray Serve (``serving.engine=ray``): the same app, its models on Ray deployments.

``RayServingProcess(settings).run()`` joins the Ray cluster at ``settings.ray.address`` or starts a local
one (its session, sockets and logs under ``settings.ray.temp_dir``, by default ``<state folder>/ray``;
no dashboard), starts Serve's HTTP proxy on the serving host and port (on the head node, or on every node
with ``ray.proxy_location=EveryNode``), creates the artifact store (``ray_artifacts``: a detached actor
on this process's node, so it outlives any ingress replica; killed when serving stops) and runs the
application ``examlops``: one ingress replica, pinned to this process's node, whose ASGI app is
``serving_app`` (the uvicorn engine's app, routes,
error bodies, metrics, limits) with the predict runtime ``RayPredictRuntime`` in place of the process
pool; the ingress creates one application per catalog model as its hot set loads (readiness, as on
uvicorn, is ``/readyz``: every default alias loaded). It serves until SIGTERM/SIGINT or ``close()``: then
Serve shuts down (replicas finish the calls they hold), a local cluster stops, and ``run`` returns; on a
cluster it joined, it deletes its own applications and artifact store only and leaves Serve running. One
examlops driver per cluster, by the driver lease (its contract: ``ray_lease``): joining while another
driver holds it is refused (``AlreadyRunning``), since both would serve at ``/`` and either one's stop
would delete the other's. Having taken it, a driver deletes the examlops applications a stopped driver
left (logged) and kills the artifact store it may have left; it keeps the lease every ``LEASE_CHECK_S``
while serving, stops when another driver holds it, and deletes applications only while it holds it. The
ingress is deployed with the model deployments' deadline (``settings.ray.deploy_timeout_s``):
``RayUnavailable`` with Ray's status when it is not running by then.

The ingress stays at one replica: its pipeline owns the traffic-rule cache, the admission estimate and
the hot set that ``/admin/reload`` (and so ``exa promote``) moves, which a second ingress replica would
not see. The model deployments are what scales (``settings.ray``).

Failure mode: ``RayUnavailable`` (a ``DependencyUnavailable``) when the ``ray`` extra is not installed, the
cluster cannot be reached, or the temp folder's path is too long for Ray's sockets.

Imports ray: only ``exa serve start --engine ray`` (or ``serving.engine=ray``) loads this module.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

from examlops.bootstrap.ray_lease import Lease, take_lease
from examlops.core.errors import DependencyUnavailable
from examlops.core.settings import Settings

if TYPE_CHECKING:
    from ray.serve import Application
    from starlette.types import ASGIApp

log = logging.getLogger(__name__)

INGRESS_APP = "examlops"
MODEL_APP_PREFIX = "examlops-model-"
LEASE_CHECK_S = 10.0
MAX_TEMP_DIR_CHARS = 43
"""Ray's socket paths (``<temp>/session_<date>_<time>_<micros>_<pid>/sockets/plasma_store``, 64 characters
past the folder) must fit in the 107 bytes of a Unix socket address."""


class RayUnavailable(DependencyUnavailable):
    """Ray cannot run here: the extra is missing, the cluster is unreachable, or its folder path too long."""


def ray_temp_dir(settings: Settings) -> Path:
    """Where a local Ray cluster keeps its sessions; ``RayUnavailable`` when the path is too long for Ray."""
    path = (settings.ray.temp_dir or settings.state_dir / "ray").resolve()
    if len(str(path)) > MAX_TEMP_DIR_CHARS:
        raise RayUnavailable(
            f"Ray's folder {path} is longer than {MAX_TEMP_DIR_CHARS} characters, too long for its socket "
            "paths: set EXAMLOPS_RAY__TEMP_DIR to a shorter folder (or move EXAMLOPS_HOME)"
        )
    return path


def cluster_token(path: Path) -> str:
    """The local cluster's auth token, made once and kept in ``path`` (owner-only)."""
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(secrets.token_hex(32))
    return path.read_text().strip()


def replica_settings(settings: Settings) -> Settings:
    """``settings`` with every path absolute: replicas do not share the driver's working folder."""
    update: dict[str, Any] = {"home": settings.state_dir}
    if settings.catalog_dir is not None:
        update["catalog_dir"] = settings.catalog_dir.resolve()
    return settings.model_copy(update=update)


class ExamlopsIngress:
    """The ingress deployment's class: Ray builds its ASGI app on the replica (``__serve_build_asgi_app__``)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def __serve_build_asgi_app__(self) -> ASGIApp:
        from examlops.bootstrap.serving import serving_app
        from examlops.serving.ray_runtime import RayPredictRuntime

        logging.getLogger("examlops").setLevel(logging.INFO)
        return serving_app(self._settings, runtime=RayPredictRuntime(self._settings))


class RayServingProcess:
    """Serving on Ray Serve in the foreground: ``host``/``port`` default to the settings'."""

    def __init__(self, settings: Settings, *, host: str | None = None, port: int | None = None) -> None:
        self.settings = replica_settings(settings)
        # Ray reads its environment once, when it is imported: set it first.
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage reports from a platform offline
        if self.settings.ray.address is None:
            temp = ray_temp_dir(self.settings)
            temp.mkdir(parents=True, exist_ok=True)
            # Token auth stays on, with the token in the state folder rather than ~/.ray/auth_token.
            os.environ.setdefault("RAY_AUTH_MODE", "token")
            os.environ.setdefault("RAY_AUTH_TOKEN", cluster_token(temp / "auth_token"))
        try:
            import ray  # noqa: F401  # the extra is checked before anything starts
        except ImportError as exc:
            raise RayUnavailable("the Ray engine needs the ray extra: pip install 'examlops[ray]'") from exc
        self.host = host or settings.serving.host
        self.port = port or settings.serving.port
        self._stop = threading.Event()
        self._lease: Lease | None = None  # held while serving on a joined cluster; Ray ends it with this process

    def run(self) -> None:
        import ray
        from ray import serve

        owned = self._connect(ray)
        if not owned:
            try:
                node = ray.get_runtime_context().get_node_id()
                self._claim_cluster(
                    Lease(lambda: take_lease(node), where=f"the Ray cluster at {self.settings.ray.address}")
                )
            except BaseException:
                ray.shutdown()
                raise
        from examlops.serving.ray_artifacts import create_store, kill_store

        try:
            proxy = self.settings.ray.proxy_location
            serve.start(http_options={"host": self.host, "port": self.port}, proxy_location=proxy)
            create_store(ray.get_runtime_context().get_node_id())  # outlives any ingress replica; killed below
            self._deploy_ingress(ray)
            log.warning("serving on Ray Serve at http://%s:%d", self.host, self.port)
            self._wait()
        finally:
            if owned:
                try:
                    serve.shutdown()  # type: ignore[no-untyped-call]  # ray leaves it unannotated
                    kill_store()
                finally:
                    ray.shutdown()
            else:
                self._delete_applications()

    def _claim_cluster(self, lease: Lease) -> None:
        """Take the driver lease (``AlreadyRunning`` when a live driver holds it), then delete the examlops
        applications and the artifact store a stopped driver left behind, if any."""
        from ray import serve

        lease.take()
        self._lease = lease
        ours = sorted(n for n in serve.status().applications if n == INGRESS_APP or n.startswith(MODEL_APP_PREFIX))
        if ours:
            log.warning(
                "the Ray cluster at %s runs the examlops application(s) %s with no driver holding the lease (it "
                "stopped): deleting them to serve anew",
                self.settings.ray.address,
                ", ".join(ours),
            )
        self._delete_applications()  # the store too, even with no application left: its blobs are stale

    def _delete_applications(self) -> None:
        """On a cluster this process joined, while it holds the lease: remove its applications and artifact
        store only; Serve and the cluster stay. Without the lease, nothing (another driver's, or in doubt)."""
        from ray import serve

        from examlops.serving.ray_artifacts import kill_store

        if self._lease is None or not self._lease.held():
            log.error("not deleting the examlops applications: this driver does not hold the lease (any more)")
            return
        for name in serve.status().applications:
            if name == INGRESS_APP or name.startswith(MODEL_APP_PREFIX):
                try:
                    serve.delete(name)
                except Exception as exc:  # the others still go
                    log.error("could not delete the Serve application %s: %s", name, exc)
        try:
            kill_store()
        except Exception as exc:
            log.error("could not kill the artifact store: %s", exc)

    def close(self) -> None:
        """Stop serving, as a SIGTERM does."""
        self._stop.set()

    def _connect(self, ray: Any) -> bool:
        """Join the configured cluster or start a local one; True when this process owns the cluster."""
        address = self.settings.ray.address
        import examlops

        # Workers import the driver's examlops, wherever it is installed or checked out.
        package_root = str(Path(examlops.__file__).resolve().parent.parent)
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        kwargs: dict[str, Any] = {
            "namespace": "examlops",
            "log_to_driver": False,
            "runtime_env": {"env_vars": {"PYTHONPATH": path}},
        }
        if address is None:
            kwargs.update(
                num_cpus=self.settings.ray.num_cpus or os.cpu_count() or 1,
                include_dashboard=False,
                _temp_dir=str(ray_temp_dir(self.settings)),
                _node_ip_address="127.0.0.1",  # a local cluster talks over loopback only
            )
        try:
            ray.init(address=address, **kwargs)
        except Exception as exc:
            raise RayUnavailable(f"cannot start or reach the Ray cluster: {type(exc).__name__}: {exc}") from exc
        return address is None

    def _deploy_ingress(self, ray: Any) -> None:
        """Run the ingress application; ``RayUnavailable`` when it is not running within the deploy deadline."""
        from ray import serve
        from ray.serve import RunTarget

        from examlops.core.errors import ModelLoadError
        from examlops.serving.ray_deploy import wait_running

        serve.run_many(
            [RunTarget(target=self._ingress(ray), name=INGRESS_APP, route_prefix="/")],
            wait_for_applications_running=False,
        )
        try:
            wait_running(INGRESS_APP, self.settings.ray.deploy_timeout_s)
        except ModelLoadError as exc:
            raise RayUnavailable(f"the ingress did not start: {exc}") from exc

    def _ingress(self, ray: Any) -> Application:
        from ray import serve
        from ray.serve import Deployment

        # Pinned to this process's node by the node's own resource (``node:<address>``).
        node = ray.get_runtime_context().get_node_id()
        address = next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node)

        # ``serve.deployment``'s annotation only knows its decorator form: say what it returns.
        ingress = cast(
            Deployment,
            serve.deployment(
                serve.ingress()(ExamlopsIngress),
                name="ingress",
                num_replicas=1,
                max_ongoing_requests=max(1000, self.settings.serving.max_connections),
                ray_actor_options={"num_cpus": 0.25, "resources": {f"node:{address}": 0.001}},
                health_check_period_s=5,
                graceful_shutdown_timeout_s=self.settings.serving.drain_grace_s,
            ),
        )
        return ingress.bind(self.settings)

    def _wait(self) -> None:
        def stop(signum: int, frame: FrameType | None) -> None:
            log.warning("signal %d: shutting Ray Serve down", signum)
            self._stop.set()

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, stop)
            signal.signal(signal.SIGINT, stop)
        self.watch_lease()

    def watch_lease(self, every_s: float = LEASE_CHECK_S) -> None:
        """Wait for the stop; on a joined cluster, check the lease every ``every_s`` and stop once another
        driver holds it."""
        while not self._stop.wait(every_s):
            if self._lease is not None and not self._lease.keep():
                log.error("another examlops driver holds the lease: stopping, and leaving its applications")
                self._stop.set()
