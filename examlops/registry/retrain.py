"""Retrain one model: train a candidate on fresh data, compare it with Production, register it, point a candidate alias.

``retrain(settings, registry, spec, source)``:

1. draws ``train_rows`` fresh samples from the ``DataSource`` (a new seed each
   run unless one is given) and fits the demo recipe's regressor;
2. draws ``holdout_rows`` more (another seed) and scores the candidate and the
   current Production version on them (RMSE; Production is skipped when the
   model has none). Both are predicted by ``score`` (the composition root's
   ``bootstrap.inference.holdout_scorer``: the inference port's local adapter,
   with the MLflow loader for Production); its errors propagate;
   A Production whose model fails on the held-out rows (``InferenceFailed``)
   is scored as failing: any candidate that predicts them beats it;
3. logs a run in the ``examlops-retrain`` experiment (metrics, the data source
   and seed as params) and registers the version. Only a candidate better than
   Production, or with no Production to beat (``better`` is not False), gets ``candidate_alias``
   (Canary or Staging, never Production: promotion is a separate, audited
   step), moved with ``promotion.service.move_audited`` so that the move can be
   rolled back and goes on the audit trail as intent then outcome (``trail``):
   a worse candidate is registered, never served (``moved`` False).

Returns a ``RetrainResult``. Errors: ``InvalidInput`` for an alias that is
not a candidate alias (``checked_candidate_alias``: callers that record the
retrain's outcome check it first, so refused input is no outcome), the
registry's errors otherwise.

The data source is also what the drift report's reference describes: the
distribution a version was trained on (``source_of_run`` rebuilds it from the
params a run logged).
"""

from __future__ import annotations

import secrets
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from examlops.core.errors import AliasNotFound, InferenceFailed, InvalidInput
from examlops.core.messages import ModelRef, canonical_alias
from examlops.core.settings import Settings
from examlops.promotion.service import move_audited
from examlops.promotion.trail import MoveTrail
from examlops.registry.catalog import ModelSpec
from examlops.registry.demo_models import RECIPES, fit_regressor
from examlops.registry.loader import Estimator
from examlops.registry.mlflow_registry import MlflowRegistry
from examlops.registry.registration import ensure_experiment, log_and_register
from examlops.registry.synthetic import FloatArray, IntArray, features, make_dataset

RETRAIN_EXPERIMENT = "examlops-retrain"
CANDIDATE_ALIASES = ("Canary", "Staging")
TRAIN_ROWS = 800
HOLDOUT_ROWS = 400


def checked_candidate_alias(alias: str) -> str:
    """``alias`` in its canonical spelling; ``InvalidInput`` unless it is one of ``CANDIDATE_ALIASES`` (never
    Production: promotion is a separate, audited step)."""
    canonical = canonical_alias(alias)
    if canonical not in CANDIDATE_ALIASES:
        raise InvalidInput(f"the candidate alias must be one of {', '.join(CANDIDATE_ALIASES)}", field="alias")
    return canonical


@dataclass(frozen=True, slots=True)
class Sample:
    embeddings: FloatArray
    node_count: IntArray
    target: FloatArray


class DataSource(Protocol):
    """Where training data comes from. ``params`` are logged with the run and rebuild the source later."""

    @property
    def params(self) -> Mapping[str, str]: ...

    def sample(self, spec: ModelSpec, rows: int, seed: int) -> Sample: ...


class SyntheticDataSource:
    """The synthetic generator (``registry.synthetic``); ``shift`` > 0 draws from a moved distribution."""

    def __init__(self, shift: float = 0.0) -> None:
        if shift < 0:
            raise InvalidInput("the data shift must be >= 0", field="shift")
        self.shift = shift

    @property
    def params(self) -> Mapping[str, str]:
        return {"data_source": "synthetic", "data_shift": repr(self.shift)}

    def sample(self, spec: ModelSpec, rows: int, seed: int) -> Sample:
        x, nodes, y = make_dataset(rows, dim=spec.embedding_dim, seed=seed, shift=self.shift)
        return Sample(x, nodes, y)


def source_of_run(params: Mapping[str, str]) -> DataSource:
    """The data source a run logged; the unshifted synthetic one for runs that logged none (the demo seed)."""
    if params.get("data_source", "synthetic") != "synthetic":
        raise InvalidInput(f"unknown data source {params['data_source']!r}", field="data_source")
    return SyntheticDataSource(float(params.get("data_shift", "0.0")))


@dataclass(frozen=True, slots=True)
class RetrainResult:
    model: str
    version: str
    run_id: str
    alias: str
    replaced_version: str | None
    """What ``alias`` pointed at before."""
    candidate_rmse: float
    production_version: str | None
    production_rmse: float | None
    """None without Production, or when its model failed on the held-out rows (``production_error``)."""
    seed: int
    train_rows: int
    holdout_rows: int
    moved: bool = True
    """Whether ``alias`` now points at the candidate (False: it was worse than Production)."""
    production_error: str = ""
    """Why Production could not be scored ('' when it was, or there is none)."""

    @property
    def better(self) -> bool | None:
        """Whether the candidate beats Production on the held-out rows; None without Production; True when
        Production's model failed on them."""
        if self.production_error:
            return True
        return None if self.production_rmse is None else self.candidate_rmse < self.production_rmse


Loader = Callable[[str], Any]

HoldoutScorer = Callable[[ModelRef | Estimator, FloatArray, FloatArray], FloatArray]
"""``(a registered version or a fitted estimator, embeddings (n, dim), node counts (n,)) -> its predictions (n,)``."""


def retrain(
    settings: Settings,
    registry: MlflowRegistry,
    spec: ModelSpec,
    source: DataSource,
    *,
    score: HoldoutScorer,
    candidate_alias: str = "Canary",
    seed: int | None = None,
    train_rows: int = TRAIN_ROWS,
    holdout_rows: int = HOLDOUT_ROWS,
    reason: str = "",
    on_progress: Callable[[str], None] | None = None,
    trail: MoveTrail | None = None,
) -> RetrainResult:
    """Train, evaluate against Production, log, register and move ``candidate_alias`` (module docstring)."""
    say = on_progress or (lambda _message: None)
    alias = checked_candidate_alias(candidate_alias)
    seed = secrets.randbelow(2**31) if seed is None else seed
    say(f"{spec.name}: training a candidate on {train_rows} fresh rows (seed {seed})")
    data = source.sample(spec, train_rows, seed)
    recipe = RECIPES[-1]
    model = fit_regressor(features(data.embeddings, data.node_count), data.target, recipe, seed)
    holdout = source.sample(spec, holdout_rows, seed + 1)
    counts = holdout.node_count.astype(np.float64)
    candidate_rmse = _rmse(score(model, holdout.embeddings, counts), holdout.target)
    say(f"{spec.name}: scoring Production on {holdout_rows} held-out rows")
    production = _production(registry, spec.name)
    production_rmse, production_error = None, ""
    if production is not None:
        try:
            production_rmse = _rmse(score(production, holdout.embeddings, counts), holdout.target)
        except InferenceFailed as exc:
            production_error = f"Production (version {production.version}) failed on the held-out rows: {exc}"
            say(f"{spec.name}: {production_error}")
    metrics = {"holdout_rmse": candidate_rmse, "train_rows": float(train_rows), "holdout_rows": float(holdout_rows)}
    if production_rmse is not None:
        metrics["production_holdout_rmse"] = production_rmse
    params = {
        **source.params,
        "seed": str(seed),
        "recipe_max_iter": str(recipe.max_iter),
        "recipe_learning_rate": str(recipe.learning_rate),
        "recipe_max_leaf_nodes": str(recipe.max_leaf_nodes),
        "candidate_alias": alias,
        "compared_with_version": production.version if production else "",
        "reason": reason[:250],
    }
    say(f"{spec.name}: logging and registering the candidate")
    experiment = ensure_experiment(registry, settings, RETRAIN_EXPERIMENT)
    registered = log_and_register(registry, settings, experiment, spec, model, f"{spec.name}-retrain", metrics, params)
    worse = not production_error and production_rmse is not None and candidate_rmse >= production_rmse
    replaced = None
    if worse:
        say(f"{spec.name}: version {registered.version} (RMSE {candidate_rmse:.4f}) is not better than Production "
            f"(RMSE {production_rmse:.4f}); {alias} stays where it was")  # fmt: skip
    else:
        replaced = move_audited(registry, spec.name, alias, version=registered.version, trail=trail).old_version
        say(f"{spec.name}: {alias} -> version {registered.version}")
    return RetrainResult(
        spec.name, registered.version, registered.run_id, alias, replaced, candidate_rmse,
        production.version if production else None, production_rmse, seed, train_rows, holdout_rows,
        not worse, production_error,
    )  # fmt: skip


def reference_sample(
    registry: MlflowRegistry, spec: ModelSpec, ref: ModelRef, rows: int, *, load: Loader | None = None
) -> tuple[FloatArray, FloatArray]:
    """``rows`` samples of the distribution version ``ref`` was trained on, and its predictions on them.

    The seed depends only on the model's name: a version's reference is the same every time it is built.
    """
    params: Mapping[str, str] = {}
    if ref.run_id:
        params = dict(registry.client.get_run(ref.run_id).data.params)
    data = source_of_run(params).sample(spec, rows, zlib.crc32(f"reference:{spec.name.lower()}".encode()))
    predictor = _loader(load)(registry.fetch(ref))
    predictions = np.asarray(predictor.predict(features(data.embeddings, data.node_count)), dtype=np.float64)
    return data.embeddings, predictions


def _production(registry: MlflowRegistry, name: str) -> ModelRef | None:
    try:
        return registry.resolve(name, "Production")
    except AliasNotFound:
        return None


def _loader(load: Loader | None) -> Loader:
    if load is not None:
        return load
    from examlops.registry.loader import load_sklearn_model

    return load_sklearn_model


def _rmse(predicted: Any, actual: FloatArray) -> float:
    return float(np.sqrt(np.mean((np.asarray(predicted, dtype=np.float64) - actual) ** 2)))
