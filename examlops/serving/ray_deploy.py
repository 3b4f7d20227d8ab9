"""Deploying one model's Ray Serve application and waiting, with a deadline, until every replica runs it.

Model ``M`` is the application ``examlops-model-M`` (no HTTP route) of one deployment of
``ray_replica.ModelReplica``, with its replicas and autoscaling from ``settings.ray`` and its
``user_config`` naming the versions every replica holds (``{key: artifact token}``).

``deploy_model`` hands the application to Serve without blocking, then polls ``serve.status()`` until the
application is ``RUNNING`` (Ray marks it so once every replica took the new ``user_config``; a replica
whose ``reconfigure`` raised never counts; ours never raise: ``running_replicas`` names the replicas whose
reports the runtime then waits for). It raises ``ModelLoadError`` with Ray's status messages when
the application's deploy failed (``DEPLOY_FAILED``), or when ``settings.ray.deploy_timeout_s`` passes
first (e.g. replicas that the cluster has no CPUs to place, which Ray would otherwise wait for forever).
``UNHEALTHY`` is waited out: Ray reports it while it replaces a replica that failed its health check.

Imports ray: only the Ray engine loads this module.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, cast

from ray import serve
from ray.serve import Deployment, RunTarget

from examlops.core.errors import ModelLoadError, ModelLoadTimeout
from examlops.core.settings import Settings
from examlops.serving.ray_replica import ModelReplica

DEPLOYMENT = "replica"
HEALTH_CHECK_PERIOD_S = 2.0
"""A replica whose prediction timed out fails its health check; Ray looks this often."""
INTERNAL_VERSION = "examlops-model-replica"
"""Fixed, so that a redeploy that changes only ``user_config`` reconfigures replicas instead of replacing
them (Ray gives an unversioned deployment a new random version on every ``serve.run``)."""
POLL_S = 0.2
_SUBMIT = threading.Lock()
"""One application built and submitted at a time in this process: Serve registers modules for pickling by
value and unregisters them around building a deployment's config and around each submission, process-wide,
so two threads at once make the later unregister fail (``ValueError: ... is not registered for pickle by
value``). Waiting stays concurrent."""
REPLICA_WAIT_S = 0.0
"""The replicas' ``@serve.batch`` wait: batching happens once, in the ingress."""


def app_name(model: str) -> str:
    return f"examlops-model-{model}"  # bootstrap.ray_serving.MODEL_APP_PREFIX deletes these


def deployment_options(settings: Settings) -> dict[str, Any]:
    """Serve options of every model deployment: replicas or autoscaling, limits and CPUs from ``settings.ray``."""
    ray = settings.ray
    options: dict[str, Any] = {
        "name": DEPLOYMENT,
        "max_ongoing_requests": ray.max_ongoing_requests,
        "ray_actor_options": {"num_cpus": ray.replica_cpus},
        "health_check_period_s": HEALTH_CHECK_PERIOD_S,
    }
    if ray.max_replicas is None:
        options["num_replicas"] = ray.num_replicas
    else:
        options["autoscaling_config"] = {
            "min_replicas": ray.min_replicas,
            "max_replicas": ray.max_replicas,
            "target_ongoing_requests": ray.target_ongoing_requests,
        }
    return options


def model_application(settings: Settings, model: str, versions: dict[str, str]) -> serve.Application:
    """The application of one model's replicas holding ``versions`` (key -> artifact token)."""
    options = {**deployment_options(settings), "user_config": {"versions": versions}}
    # The overloads of ``serve.deployment`` read a class as a decorator's argument list: say what it returns.
    deployment = cast(Deployment, serve.deployment(ModelReplica)).options(**options)
    # ``version`` is no longer a public option; the internal flag keeps it fixed (see INTERNAL_VERSION).
    deployment = deployment.options(version=INTERNAL_VERSION, _internal=True)
    # The ingress's micro-batcher already waited for rows (settings.batch): the replica only merges the calls
    # queued when it looks, instead of waiting a second time (bench/RESULTS.md, p50 at c=1).
    return deployment.bind(model, settings.batch.max_size, REPLICA_WAIT_S, settings.predict.timeout_s)


def deploy_model(settings: Settings, model: str, versions: dict[str, str]) -> None:
    """Create or update the application of ``model``; return once it runs everywhere (contract above)."""
    with _SUBMIT:  # building the application serialises its config too (the request router, by value)
        application = model_application(settings, model, versions)
        target = RunTarget(target=application, name=app_name(model), route_prefix=None)
        serve.run_many([target], wait_for_applications_running=False)
    wait_running(app_name(model), settings.ray.deploy_timeout_s)


def running_replicas(model: str) -> set[str]:
    """The ids of the replicas of ``model`` that Serve reports running (the ids they report under)."""
    from ray.serve.context import _get_global_client  # Serve's details name each replica; its status counts them

    client = _get_global_client()
    assert client is not None  # the ingress runs inside Serve
    details = client.get_serve_details()
    deployment = details.get("applications", {}).get(app_name(model), {}).get("deployments", {}).get(DEPLOYMENT, {})
    return {str(r["replica_id"]) for r in deployment.get("replicas", []) if str(r.get("state")).endswith("RUNNING")}


def wait_running(
    app: str,
    timeout_s: float,
    *,
    status: Callable[[], Any] = serve.status,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Poll ``status()`` until ``app`` is RUNNING; ``ModelLoadError`` when it failed, ``ModelLoadTimeout``
    (retryable: a busy cluster, not the version's fault) when the deadline passed first."""
    deadline = clock() + timeout_s
    while True:
        state = status().applications.get(app)
        current = "absent" if state is None else str(state.status)
        if current.endswith("RUNNING"):
            return
        if current.endswith("DEPLOY_FAILED"):  # UNHEALTHY passes: a replica being replaced, say after a 504
            raise ModelLoadError(f"Ray could not deploy {app}: {describe(state)}")
        if clock() >= deadline:
            raise ModelLoadTimeout(f"{app} was not running on every replica within {timeout_s:g} s: {describe(state)}")
        sleep(POLL_S)


def describe(state: Any) -> str:
    """The application's status and its deployments' messages, as Ray reports them."""
    if state is None:
        return "Serve does not know the application"
    parts = [f"{state.status}" + (f" ({state.message})" if state.message else "")]
    for name, deployment in getattr(state, "deployments", {}).items():
        if deployment.message:
            parts.append(f"{name} {deployment.status}: {_gist(str(deployment.message))}")
    return "; ".join(parts)[:1500]


def _gist(message: str) -> str:
    """A Ray message's first line and, for one that ends in a traceback, its last line (the replica's error)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) <= 1:
        return message.strip()
    return f"{lines[0][:600]} ... {lines[-1][:600]}"
