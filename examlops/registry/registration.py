"""Logging a fitted model in its own MLflow run and registering it as a new version.

Contracts: ``ensure_experiment`` returns an experiment's id, creating it (or restoring a deleted one);
``log_and_register`` logs the model in skops format with a tensor signature, its metrics and params,
then registers a version under the model's existing spelling (creating the registered model when there
is none). With a local store every file lands under ``settings.state_dir``: the SQLite file, the
artifacts (``settings.mlflow_artifact_root``) and temporary folders.

Failure mode: ``RegistryUnavailable`` when the store cannot be reached, another ``ExamlopsError`` when
MLflow refuses a step (a model holding a skops type it was not told to trust is refused).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from examlops.core.errors import ExamlopsError, ModelNotFound
from examlops.core.settings import Settings
from examlops.registry.catalog import ModelSpec
from examlops.registry.mlflow_client import import_mlflow, translate_error
from examlops.registry.mlflow_registry import MlflowRegistry
from examlops.registry.synthetic import feature_count

# skops (MLflow's default) rather than cloudpickle: loading stays restricted to
# reviewed types. HistGradientBoosting needs exactly one more, its tree
# predictor; we wrote these files ourselves, so it is trusted by name. If a
# scikit-learn release adds another type, logging refuses loudly instead of
# silently trusting everything.
TRUSTED_SKOPS_TYPES = ("sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",)


def _is_local(uri: str) -> bool:
    return urlparse(uri).scheme in ("", "file", "sqlite")


def ensure_experiment(registry: MlflowRegistry, settings: Settings, name: str) -> str:
    """The id of experiment ``name``, created with its artifacts under the state folder when the store is local."""
    client = registry.client
    try:
        experiment = client.get_experiment_by_name(name)
        if experiment is not None:
            if experiment.lifecycle_stage == "deleted":
                client.restore_experiment(experiment.experiment_id)
            return str(experiment.experiment_id)
        location = None  # a tracking server chooses its own artifact store
        if _is_local(settings.mlflow_tracking_uri):
            root = settings.mlflow_artifact_root / name
            root.mkdir(parents=True, exist_ok=True)
            location = root.as_uri()
        return str(client.create_experiment(name, artifact_location=location))
    except ExamlopsError:
        raise
    except Exception as exc:
        raise translate_error(exc, lambda: ExamlopsError(f"experiment {name!r} vanished")) from exc


@dataclass(frozen=True, slots=True)
class RegisteredVersion:
    version: str
    run_id: str


def log_and_register(
    registry: MlflowRegistry,
    settings: Settings,
    experiment_id: str,
    spec: ModelSpec,
    model: Any,
    run_name: str,
    metrics: Mapping[str, float],
    params: Mapping[str, str],
    *,
    trusted_types: Sequence[str] = TRUSTED_SKOPS_TYPES,
    description: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> RegisteredVersion:
    """Log ``model`` (skops, tensor signature) in a new run with its metrics and params, register a version.

    ``trusted_types`` are the skops types, beyond skops' defaults, that loading the model may build; logging
    refuses a model holding any other. ``description`` goes on the version and the run, ``tags`` on the version.
    Every file lands under the state folder when the store is local. ``RegistryUnavailable``, or another
    ``ExamlopsError`` when MLflow refuses a step.
    """
    with _registering(spec):
        # Client calls rather than the fluent mlflow.sklearn.log_model: that one reads the
        # process-global tracking URI, and MLflow's SQL registry resolves a "models:/<id>"
        # source through a global MlflowClient (which creates ./mlflow.db when nothing is set).
        # Registering the concrete artifact location avoids both.
        import_mlflow()
        import mlflow.sklearn
        from mlflow.entities import LoggedModelOutput, LoggedModelStatus, Metric, Param, RunTag
        from mlflow.models import Model, ModelSignature
        from mlflow.types import Schema, TensorSpec

        client = registry.client
        run_id = client.create_run(experiment_id, run_name=run_name).info.run_id
        now_ms = int(time.time() * 1000)
        run_tags = [RunTag("examlops.model", spec.name)]
        if description:
            run_tags.append(RunTag("mlflow.note.content", description))  # the run's description in the MLflow UI
        client.log_batch(
            run_id,
            metrics=[Metric(key, float(value), now_ms, 0) for key, value in metrics.items()],
            params=[Param(key, value) for key, value in params.items()],
            tags=run_tags,
        )
        logged = client.create_logged_model(experiment_id, name="model", source_run_id=run_id)
        columns = feature_count(spec.embedding_dim)
        # A tensor signature: a DataFrame signature checks every column on each predict (bench/RESULTS.md).
        signature = ModelSignature(
            inputs=Schema([TensorSpec(np.dtype(np.float64), (-1, columns))]),
            outputs=Schema([TensorSpec(np.dtype(np.float64), (-1,))]),
        )
        with tempfile.TemporaryDirectory(dir=settings.state_dir, prefix=".seed-") as tmp:
            local = str(Path(tmp) / "model")
            mlflow.sklearn.save_model(
                model,
                local,
                mlflow_model=Model(
                    artifact_path=logged.artifact_location,
                    run_id=run_id,
                    model_id=logged.model_id,
                    model_uuid=logged.model_id,
                ),
                serialization_format="skops",
                skops_trusted_types=list(trusted_types),
                signature=signature,
                # Explicit: inferring them takes seconds per model (bench/RESULTS.md).
                pip_requirements=[
                    f"{dist}=={dist_version(dist)}" for dist in ("mlflow", "scikit-learn", "skops", "numpy")
                ],
            )
            client.log_model_artifacts(logged.model_id, local)
        client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=0)])
        client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
        client.set_terminated(run_id)
        name = _registered_name(registry, spec.name)
        version = client.create_model_version(
            name,
            source=logged.artifact_location,
            run_id=run_id,
            model_id=logged.model_id,
            description=description,
            tags=dict(tags or {}),
        )
        return RegisteredVersion(str(version.version), str(run_id))


@contextmanager
def _registering(spec: ModelSpec) -> Iterator[None]:
    """MLflow's failures while logging and registering, as ours (``ExamlopsError`` passes unchanged)."""
    try:
        yield
    except ExamlopsError:
        raise
    except Exception as exc:
        raise translate_error(exc, lambda: ModelNotFound(f"model {spec.name!r} vanished while registering")) from exc


def _registered_name(registry: MlflowRegistry, name: str) -> str:
    """The registered model's existing spelling of ``name``, creating the model when there is none."""
    for existing in registry.list_models():
        if existing.lower() == name.lower():
            return existing
    registry.client.create_registered_model(name)
    return name
