"""Seed the MLflow registry with three demo versions of every catalog model: two good ones and one that fails.

Each model gets two HistGradientBoosting versions trained on synthetic data
(different samples and hyperparameters), each logged in its own run of the
``examlops-demo`` experiment and registered under the catalog name; then
Production points at the first and Canary at the second. A third version,
Staging, fails on purpose while predicting (``faulty_regressor``), so that
``exa demo traffic --fail-rate`` can send real model failures and a user can
watch the retrain trigger fire; serving has no fault switch.

Idempotent: a model that already has Production, Canary and Staging is
skipped. A model lacking Production or Canary gets two new trained versions
and only the missing alias; one lacking Staging gets only a new failing
version. An alias a model has, whoever set it, is never moved.

With a local store every file lands under ``settings.state_dir``: the SQLite
file, the artifacts (``settings.mlflow_artifact_root``) and temporary folders.
"""

from __future__ import annotations

import tempfile
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from examlops.core.errors import ExamlopsError, ModelNotFound
from examlops.core.settings import Settings
from examlops.registry.catalog import Catalog, ModelSpec
from examlops.registry.mlflow_client import import_mlflow, translate_error
from examlops.registry.mlflow_registry import MlflowRegistry
from examlops.registry.synthetic import feature_count, features, make_dataset

DEMO_EXPERIMENT = "examlops-demo"
SEEDED_ALIASES = ("Production", "Canary")
"""The aliases of the two trained versions, in version order."""
FAULTY_ALIAS = "Staging"
FAULTY_DESCRIPTION = "demo: fails on purpose so the retrain trigger can be seen"
FAULTY_TAGS: Mapping[str, str] = {"examlops.demo": "fails-on-purpose"}
TRAIN_ROWS = 800
HOLDOUT_ROWS = 200
# skops (MLflow's default) rather than cloudpickle: loading stays restricted to
# reviewed types. HistGradientBoosting needs exactly one more, its tree
# predictor; we wrote these files ourselves, so it is trusted by name. If a
# scikit-learn release adds another type, logging refuses loudly instead of
# silently trusting everything.
TRUSTED_SKOPS_TYPES = ("sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",)
# The failing version needs none beyond skops' defaults (checked with skops.io.get_untrusted_types, skops
# 0.16): Pipeline, FunctionTransformer and LinearRegression are scikit-learn types skops trusts, and numpy.log
# is a numpy ufunc, which it trusts too. Empty, not TRUSTED_SKOPS_TYPES: a version trusts only what it holds.
FAULTY_SKOPS_TYPES: tuple[str, ...] = ()
FAULTY_SEED_OFFSET = 3


@dataclass(frozen=True, slots=True)
class SeedReport:
    """Which catalog models got new versions and which already had Production, Canary and Staging."""

    created: tuple[str, ...]
    skipped: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Recipe:
    seed_offset: int
    max_iter: int
    learning_rate: float
    max_leaf_nodes: int
    max_bins: int = 63  # 385 features: fewer bins keep each fit near half a second


RECIPES = (Recipe(1, 20, 0.15, 15), Recipe(2, 30, 0.1, 31))
"""Version 1 and version 2 of every demo model."""


def seed_demo(settings: Settings, catalog: Catalog, on_progress: Callable[[str], None] | None = None) -> SeedReport:
    """Register the demo versions every catalog model lacks (module docstring); skip models that lack none.

    Raises ``RegistryUnavailable`` when the store cannot be reached and
    another ``ExamlopsError`` when MLflow refuses a step; models finished
    before the failure stay seeded, so running it again completes the rest.
    """
    say = on_progress or (lambda _message: None)
    registry = MlflowRegistry(settings.mlflow_tracking_uri, settings.state_dir / "cache" / "models")
    created: list[str] = []
    skipped: list[str] = []
    experiment_id: str | None = None
    for spec in catalog:
        try:
            have = registry.aliases(spec.name)
        except ModelNotFound:
            have = {}
        if all(alias in have for alias in (*SEEDED_ALIASES, FAULTY_ALIAS)):
            say(f"{spec.name}: has {', '.join(SEEDED_ALIASES)} and {FAULTY_ALIAS}, skipped")
            skipped.append(spec.name)
            continue
        experiment_id = experiment_id or ensure_experiment(registry, settings, DEMO_EXPERIMENT)
        if not all(alias in have for alias in SEEDED_ALIASES):
            versions = []
            for number, recipe in enumerate(RECIPES, start=1):
                say(f"{spec.name}: training and logging demo version {number} of {len(RECIPES)}")
                versions.append(_train_and_register(registry, settings, experiment_id, spec, recipe))
            for alias, version in zip(SEEDED_ALIASES, versions, strict=True):
                if alias not in have:
                    registry.set_alias(spec.name, alias, version)
                    say(f"{spec.name}: {alias} -> version {version}")
        if FAULTY_ALIAS not in have:
            say(f"{spec.name}: logging the demo version that fails on purpose")
            version = _register_faulty(registry, settings, experiment_id, spec)
            registry.set_alias(spec.name, FAULTY_ALIAS, version)
            say(f"{spec.name}: {FAULTY_ALIAS} -> version {version} (fails on purpose)")
        created.append(spec.name)
    return SeedReport(created=tuple(created), skipped=tuple(skipped))


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


def _seed(spec: ModelSpec, offset: int) -> int:
    return zlib.crc32(spec.name.lower().encode()) % 100_000 * 10 + offset


def _train(spec: ModelSpec, recipe: Recipe) -> tuple[Any, dict[str, float]]:
    seed = _seed(spec, recipe.seed_offset)
    x, nodes, y = make_dataset(TRAIN_ROWS, dim=spec.embedding_dim, seed=seed)
    model = fit_regressor(features(x, nodes), y, recipe, seed)
    hx, hnodes, hy = make_dataset(HOLDOUT_ROWS, dim=spec.embedding_dim, seed=seed + 5)
    rmse = float(np.sqrt(np.mean((model.predict(features(hx, hnodes)) - hy) ** 2)))
    return model, {"holdout_rmse": rmse, "train_seed": float(seed)}


def fit_regressor(rows: Any, y: Any, recipe: Recipe, seed: int) -> Any:
    """A HistGradientBoostingRegressor of ``recipe`` fitted on model rows ``rows`` and targets ``y``."""
    from sklearn.ensemble import HistGradientBoostingRegressor
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]  # ships no type information

    model = HistGradientBoostingRegressor(
        max_iter=recipe.max_iter,
        learning_rate=recipe.learning_rate,
        max_leaf_nodes=recipe.max_leaf_nodes,
        max_bins=recipe.max_bins,
        early_stopping=False,
        random_state=seed,
    )
    # One OpenMP thread: on a shared 2-core machine the default spin-waiting threads made
    # each fit 2-6 s instead of 0.3-0.7 s.
    with threadpool_limits(limits=1, user_api="openmp"):
        model.fit(rows, y)
    return model


def faulty_regressor(spec: ModelSpec) -> Any:
    """A model that takes any demo row and fails while predicting it, as a broken model does.

    ``Pipeline(FunctionTransformer(np.log), LinearRegression())``, fitted on the magnitudes of demo rows so
    that fitting works. Served rows hold the embedding as it is, and demo embeddings always have negative
    components (384 of them, centred on 0): ``np.log`` gives NaN and ``LinearRegression.predict`` raises
    ``ValueError("Input X contains NaN.")``, which the predict pool reports as ``InferenceFailed``.
    """
    from sklearn.linear_model import LinearRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import FunctionTransformer

    x, nodes, y = make_dataset(TRAIN_ROWS, dim=spec.embedding_dim, seed=_seed(spec, FAULTY_SEED_OFFSET))
    model = Pipeline([("log", FunctionTransformer(np.log)), ("regress", LinearRegression())])
    model.fit(np.abs(features(x, nodes)), y)
    return model


def _register_faulty(registry: MlflowRegistry, settings: Settings, experiment_id: str, spec: ModelSpec) -> str:
    """Log the failing version in its own run, described as failing on purpose; return its version number."""
    model = faulty_regressor(spec)
    metrics = {"train_seed": float(_seed(spec, FAULTY_SEED_OFFSET))}  # no holdout RMSE: it cannot predict
    params = {"pipeline": "log -> LinearRegression", "purpose": FAULTY_DESCRIPTION}
    return log_and_register(
        registry, settings, experiment_id, spec, model, f"{spec.name}-demo-faulty", metrics, params,
        trusted_types=FAULTY_SKOPS_TYPES, description=FAULTY_DESCRIPTION, tags=FAULTY_TAGS,
    ).version  # fmt: skip


def _train_and_register(
    registry: MlflowRegistry, settings: Settings, experiment_id: str, spec: ModelSpec, recipe: Recipe
) -> str:
    """Train one version, log it in its own run and register it; return the new version number."""
    model, metrics = _train(spec, recipe)
    params = {key: str(value) for key, value in asdict(recipe).items()}
    run_name = f"{spec.name}-demo-{recipe.seed_offset}"
    return log_and_register(registry, settings, experiment_id, spec, model, run_name, metrics, params).version


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
    try:
        return _log_and_register(
            registry, settings, experiment_id, spec, model, run_name, metrics, params,
            trusted_types=trusted_types, description=description, tags=tags,
        )  # fmt: skip
    except ExamlopsError:
        raise
    except Exception as exc:
        raise translate_error(exc, lambda: ModelNotFound(f"model {spec.name!r} vanished while registering")) from exc


def _log_and_register(
    registry: MlflowRegistry,
    settings: Settings,
    experiment_id: str,
    spec: ModelSpec,
    model: Any,
    run_name: str,
    metrics: Mapping[str, float],
    params: Mapping[str, str],
    *,
    trusted_types: Sequence[str],
    description: str | None,
    tags: Mapping[str, str] | None,
) -> RegisteredVersion:
    # Client calls rather than the fluent mlflow.sklearn.log_model: that one reads the
    # process-global tracking URI, and MLflow's SQL registry resolves a "models:/<id>"
    # source through a global MlflowClient (3.17 creates ./mlflow.db when nothing is set).
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
    # A tensor signature: a 385-column DataFrame signature makes pyfunc predict ~25x slower.
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
            # Explicit: inferring them costs 6-9 s per model.
            pip_requirements=[f"{dist}=={dist_version(dist)}" for dist in ("mlflow", "scikit-learn", "skops", "numpy")],
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


def _registered_name(registry: MlflowRegistry, name: str) -> str:
    """The registered model's existing spelling of ``name``, creating the model when there is none."""
    for existing in registry.list_models():
        if existing.lower() == name.lower():
            return existing
    registry.client.create_registered_model(name)
    return name
