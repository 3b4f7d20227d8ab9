"""The predict runtime of the Ray engine: each catalog model is a Ray Serve application of model replicas.

A ``PredictRuntime`` (``examlops.serving.ports``) for the pipeline in the Ray ingress: the pipeline, hot
set, router and batcher are the ones the uvicorn engine runs; only where a batch is predicted changes.
Model ``M`` is the application ``examlops-model-M`` (``ray_deploy``) whose ``user_config`` names the
versions every replica holds, each by the token of its artifact in the store (``ray_artifacts``).

- ``load(key, location)`` first loads the local folder ``location`` in a thread with the replicas' loader
  (``load_sklearn_model``): a version that cannot load is refused (``ModelLoadError``) before Ray sees
  it. It then ships the folder to the artifact store (replicas on any node fetch it through Ray; no path
  crosses to them), adds ``key: token`` to the model's ``user_config`` and redeploys the application: a
  change of ``user_config`` alone is applied in place (Ray calls each replica's ``reconfigure``; no
  replica restarts, traffic keeps flowing). Once Ray reports the application running, it waits until
  every running replica (Serve's details) reported its outcome for the version to the store: one that
  failed refuses the version with that replica's reason (``ModelLoadError``), reports missing at the
  deadline with ``ModelLoadTimeout`` (retryable), and the version is taken out of the config again
  (replicas drop it in place; none stops). ``settings.ray.deploy_timeout_s`` at
  most for the deploy, and again for the replicas' reports. The first load of a model creates its
  application. Returns the input columns the model declares.
- ``unload(key)`` takes the version out of the config (every replica drops it) and out of the store.
- ``model_capacity``: the predict calls one model's replicas run at once (the pipeline gives each model
  that many predict slots and batches in flight, and estimates a call's wait from its own model's work
  over them, instead of every model's over ``predict.workers``).
- ``predict(key, rows)`` calls one replica through the model's deployment handle (Ray's router picks
  it); the replica batches calls (``@serve.batch``). Past ``timeout_s`` the call is cancelled and
  ``InferenceTimeout`` raised (the HTTP layer's 504). A replica that died under the call, or a handle
  that cannot reach one, is ``WorkerLost`` (retryable), and so is a replica without the version (one
  started later that could not load it: it fails its health check and Ray replaces it, see
  ``ray_replica``); a failed model, ``InferenceFailed``. A version every running replica confirmed is
  marked confirmed in the store (``Artifacts.confirm``).

Redeploys of one model are serialised and coalesced: loads that arrive while one redeploy runs are
applied together by the next. The deployments keep a fixed internal version, so Ray never restarts a
replica for a redeploy that changes only the versions. A prediction that times out keeps running in its
replica's thread (a thread cannot be killed): that replica fails its next health check and Ray replaces
it, loading the same versions; the model's other replicas, then the new one, answer meanwhile.

Imports ray: only the Ray engine loads this module (the serving core does not import it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle

from examlops.core.errors import InferenceFailed, InferenceTimeout, ModelLoadError, ModelLoadTimeout, WorkerLost
from examlops.core.settings import Settings
from examlops.registry.loader import expected_features, load_sklearn_model
from examlops.serving.ports import Predictor, Rows
from examlops.serving.ray_artifacts import StoreArtifacts
from examlops.serving.ray_deploy import DEPLOYMENT, POLL_S, app_name, deploy_model, running_replicas

log = logging.getLogger(__name__)


class Artifacts(Protocol):
    """Where versions are shipped for the replicas (``ray_artifacts.StoreArtifacts``; tests pass a fake)."""

    def ship(self, key: str, folder: str) -> str: ...

    def drop(self, key: str) -> None: ...

    def outcomes(self, key: str, token: str) -> dict[str, str | None]: ...

    def confirm(self, key: str, token: str) -> None: ...


def model_of(key: str) -> str:
    """The model of a runtime key (``"JPCP/3"`` -> ``"JPCP"``)."""
    return key.rpartition("/")[0]


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
        artifacts: Artifacts | None = None,
        replicas: Callable[[str], set[str]] = running_replicas,
        check: Callable[[str], Predictor] = load_sklearn_model,
    ) -> None:
        self._settings = settings
        self._deploy = deploy
        self._new_handle = handle
        self._artifacts: Artifacts = artifacts if artifacts is not None else StoreArtifacts()
        self._replicas = replicas
        self._check = check
        self._timeout_s = settings.predict.timeout_s
        self._deploy_timeout_s = settings.ray.deploy_timeout_s
        self._wanted: dict[str, dict[str, str]] = {}
        self._asked: dict[str, int] = {}
        self._applied: dict[str, int] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._handles: dict[str, Any] = {}

    @property
    def model_capacity(self) -> int:
        """Predict calls one model's replicas run at once: its replicas, or the most autoscaling may start."""
        ray = self._settings.ray
        return ray.max_replicas if ray.max_replicas is not None else ray.num_replicas

    async def start(self) -> None:
        """Nothing to start: a model's application is created by its first load."""

    async def close(self) -> None:
        """The applications belong to the Ray engine's process, which shuts Serve down."""

    async def load(self, key: str, location: str) -> int | None:
        model = model_of(key)
        width = await self._load_here(key, location)
        token = await asyncio.to_thread(self._artifacts.ship, key, location)
        if self._wanted.get(model, {}).get(key) == token:
            await self._apply(model)
            await asyncio.to_thread(self._artifacts.confirm, key, token)  # shipping again forgot it
            return width
        self._wanted.setdefault(model, {})[key] = token
        try:
            await self._apply(model)
            await self._confirm(model, key, token)
            await asyncio.to_thread(self._artifacts.confirm, key, token)
            return width
        except Exception:
            self._wanted[model].pop(key, None)
            with contextlib.suppress(Exception):  # the first error is the one to report
                await self._apply(model)
            with contextlib.suppress(Exception):  # even when the redeploy failed: no replica may fetch it now
                await asyncio.to_thread(self._artifacts.drop, key)
            raise

    async def unload(self, key: str) -> None:
        model = model_of(key)
        if self._wanted.get(model, {}).pop(key, None) is not None:
            try:
                await self._apply(model)
            except Exception as exc:  # the replicas keep one version too many until the next redeploy
                log.error("could not drop %s from its replicas: %s", key, exc)
            try:  # the ingress routes nothing to it any more, redeployed or not
                await asyncio.to_thread(self._artifacts.drop, key)
            except Exception as exc:
                log.error("could not drop %s from the artifact store: %s", key, exc)

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
        if kind == "missing":  # the ingress holds it, so that replica failed to load it: it is being replaced
            raise WorkerLost(f"the replica that answered does not hold {key}: {value}")
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

    async def _load_here(self, key: str, location: str) -> int | None:
        """The model's input columns, loaded here as a replica would; ``ModelLoadError`` when it cannot be."""
        try:
            return expected_features(await asyncio.to_thread(self._check, location))
        except Exception as exc:
            raise ModelLoadError(f"{key} could not be loaded: {type(exc).__name__}: {exc}"[:1000]) from exc

    async def _confirm(self, model: str, key: str, token: str) -> None:
        """Return once every running replica of ``model`` reported ``key`` loaded; ``ModelLoadError`` when
        one reported a failure, ``ModelLoadTimeout`` (retryable) when the reports did not all come within the
        deploy deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._deploy_timeout_s
        while True:
            running = await asyncio.to_thread(self._replicas, model)
            outcomes = await asyncio.to_thread(self._artifacts.outcomes, key, token)
            failed = sorted((replica, reason) for replica, reason in outcomes.items() if replica in running and reason)
            if failed:
                replica, reason = failed[0]
                raise ModelLoadError(f"{key} could not be loaded on replica {replica}: {reason}")
            silent = running - outcomes.keys()
            if running and not silent:
                return
            if loop.time() >= deadline:
                raise ModelLoadTimeout(
                    f"{len(silent)} of {len(running)} running replicas of {model} did not report loading {key} "
                    f"within {self._deploy_timeout_s:g} s"
                )
            await asyncio.sleep(POLL_S)


async def _result(response: Any) -> Any:
    return await response
