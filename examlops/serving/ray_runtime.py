"""The predict runtime of the Ray engine: each catalog model is a Ray Serve application of model replicas.

A ``PredictRuntime`` (``examlops.serving.ports``) for the pipeline in the Ray ingress: the pipeline, hot
set, router and batcher are the ones the uvicorn engine runs; only where a batch is predicted changes.
Model ``M`` is the application ``examlops-model-M`` (no HTTP route) of one deployment of
``ray_replica.ModelReplica``, with its replicas and autoscaling from ``settings.ray`` and its
``user_config`` naming the versions every replica holds.

- ``load(key, location)`` adds the version to the model's ``user_config`` and redeploys the application:
  a change of ``user_config`` alone is applied in place (Ray calls each replica's ``reconfigure``; no
  replica restarts, traffic keeps flowing), and the call returns once Ray reports the application
  running, i.e. every replica holds the version. The first load of a model creates its application.
  A version that a replica could not load is taken out of the config again and ``ModelLoadError``
  names the reason. Returns the input columns the model declares.
- ``unload(key)`` takes the version out of the config (every replica drops it).
- ``predict(key, rows)`` calls one replica through the model's deployment handle (Ray's router picks
  it); the replica batches calls (``@serve.batch``). Past ``timeout_s`` the call is cancelled and
  ``InferenceTimeout`` raised (the HTTP layer's 504). A replica that died under the call, or a handle
  that cannot reach one, is ``WorkerLost`` (retryable); a replica without the version,
  ``VersionNotFound``; a failed model, ``InferenceFailed``.

Redeploys of one model are serialised and coalesced: loads that arrive while one redeploy runs are
applied together by the next. The deployments keep a fixed internal version, so Ray never restarts a
replica for a redeploy that changes only the versions. Limit: a prediction that times out keeps
running in its replica's thread until the model returns (a thread cannot be killed); the replica keeps
answering other calls meanwhile.

Imports ray: only the Ray engine loads this module (the serving core does not import it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from ray import serve
from ray.exceptions import RayActorError
from ray.serve import Deployment
from ray.serve.handle import DeploymentHandle

from examlops.core.errors import InferenceFailed, InferenceTimeout, ModelLoadError, VersionNotFound, WorkerLost
from examlops.core.settings import Settings
from examlops.serving.ports import Rows
from examlops.serving.ray_replica import ModelReplica

log = logging.getLogger(__name__)

DEPLOYMENT = "replica"
HEALTH_CHECK_PERIOD_S = 2.0
"""A replica whose prediction timed out fails its health check; Ray looks this often."""
INTERNAL_VERSION = "examlops-model-replica"
"""Fixed, so that a redeploy that changes only ``user_config`` reconfigures replicas instead of replacing
them (Ray gives an unversioned deployment a new random version on every ``serve.run``)."""


def app_name(model: str) -> str:
    return f"examlops-model-{model}"  # bootstrap.ray_serving.MODEL_APP_PREFIX deletes these


def model_of(key: str) -> str:
    """The model of a runtime key (``"JPCP/3"`` -> ``"JPCP"``)."""
    return key.rpartition("/")[0]


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
    """The application of one model's replicas holding ``versions`` (key -> artifact location)."""
    options = {**deployment_options(settings), "user_config": {"versions": versions}}
    # The overloads of ``serve.deployment`` read a class as a decorator's argument list: say what it returns.
    deployment = cast(Deployment, serve.deployment(ModelReplica)).options(**options)
    # ``version`` is no longer a public option; the internal flag keeps it fixed (see INTERNAL_VERSION).
    deployment = deployment.options(version=INTERNAL_VERSION, _internal=True)
    batch = settings.batch
    return deployment.bind(model, batch.max_size, batch.max_wait_ms / 1000, settings.predict.timeout_s)


def deploy_model(settings: Settings, model: str, versions: dict[str, str]) -> None:
    """Create or update the application of ``model`` (blocking until Ray reports it running)."""
    serve.run(model_application(settings, model, versions), name=app_name(model), route_prefix=None)


def model_handle(model: str) -> DeploymentHandle[Any]:
    return serve.get_deployment_handle(DEPLOYMENT, app_name=app_name(model))


class RayPredictRuntime:
    """A ``PredictRuntime`` over one Ray Serve application per model (contract above)."""

    def __init__(
        self,
        settings: Settings,
        *,
        deploy: Callable[[Settings, str, dict[str, str]], None] = deploy_model,
        handle: Callable[[str], Any] = model_handle,
    ) -> None:
        self._settings = settings
        self._deploy = deploy
        self._new_handle = handle
        self._timeout_s = settings.predict.timeout_s
        self._wanted: dict[str, dict[str, str]] = {}
        self._asked: dict[str, int] = {}
        self._applied: dict[str, int] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._handles: dict[str, Any] = {}

    async def start(self) -> None:
        """Nothing to start: a model's application is created by its first load."""

    async def close(self) -> None:
        """The applications belong to the Ray engine's process, which shuts Serve down."""

    async def load(self, key: str, location: str) -> int | None:
        model = model_of(key)
        if self._wanted.get(model, {}).get(key) == location:
            await self._apply(model)
            return await self._width(key)
        self._wanted.setdefault(model, {})[key] = location
        try:
            await self._apply(model)
            return await self._width(key)
        except Exception:
            self._wanted[model].pop(key, None)
            with contextlib.suppress(Exception):  # the first error is the one to report
                await self._apply(model)
            raise

    async def unload(self, key: str) -> None:
        model = model_of(key)
        if self._wanted.get(model, {}).pop(key, None) is not None:
            try:
                await self._apply(model)
            except Exception as exc:  # the replicas keep one version too many until the next redeploy
                log.error("could not drop %s from its replicas: %s", key, exc)

    async def predict(self, key: str, rows: Rows) -> npt.NDArray[np.float64]:
        response = self._handle(model_of(key)).predict.remote((key, rows))
        try:
            outcome = await asyncio.wait_for(_result(response), self._timeout_s)
        except TimeoutError:
            response.cancel()
            raise InferenceTimeout(f"{key} did not answer within {self._timeout_s:g} s") from None
        except RayActorError as exc:
            raise WorkerLost(f"the replica of {key} died under the call: {exc}") from exc
        except Exception as exc:
            raise WorkerLost(f"no replica of {key} answered: {type(exc).__name__}: {exc}") from exc
        kind, value = outcome
        if kind == "ok":
            return np.asarray(value, dtype=np.float64)
        if kind == "missing":
            raise VersionNotFound(str(value))
        if kind == "timeout":
            raise InferenceTimeout(str(value))
        raise InferenceFailed(str(value))

    def _handle(self, model: str) -> Any:
        handle = self._handles.get(model)
        if handle is None:
            handle = self._handles[model] = self._new_handle(model)
        return handle

    def _lock(self, model: str) -> asyncio.Lock:
        return self._locks.setdefault(model, asyncio.Lock())  # created on the running loop, on first use

    async def _apply(self, model: str) -> None:
        """Redeploy ``model`` with the versions wanted now, unless a redeploy since they were asked did."""
        self._asked[model] = asked = self._asked.get(model, 0) + 1
        async with self._lock(model):
            if self._applied.get(model, 0) >= asked:
                return
            current, versions = self._asked[model], dict(self._wanted.get(model, {}))
            await asyncio.to_thread(self._deploy, self._settings, model, versions)
            self._applied[model] = current

    async def _width(self, key: str) -> int | None:
        """The input columns of a version every replica now holds; ``ModelLoadError`` when it failed."""
        loaded, width, reason = await _result(self._handle(model_of(key)).state.remote(key))
        if not loaded:
            raise ModelLoadError(f"{key} could not be loaded: {reason}")
        return None if width is None else int(width)


async def _result(response: Any) -> Any:
    return await response
