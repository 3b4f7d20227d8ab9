"""The demo's models: two trained HistGradientBoosting recipes and a version that fails on purpose.

Contracts: every model takes the catalog's row (embedding, then node count) and is fitted on synthetic
data seeded by the model's name, so the same catalog always gives the same models. ``fit_regressor``
fits one recipe on one OpenMP thread; ``faulty_regressor`` fits, and then fails on every demo row at
predict time (see its docstring).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from examlops.registry.catalog import ModelSpec
from examlops.registry.synthetic import features, make_dataset

TRAIN_ROWS = 800
HOLDOUT_ROWS = 200
# The failing version needs no skops type beyond skops' defaults: Pipeline, FunctionTransformer and
# LinearRegression are scikit-learn types skops trusts, and numpy.log is a numpy ufunc, which it trusts too.
# Empty, not TRUSTED_SKOPS_TYPES: a version trusts only what it holds.
FAULTY_SKOPS_TYPES: tuple[str, ...] = ()
FAULTY_SEED_OFFSET = 3


@dataclass(frozen=True, slots=True)
class Recipe:
    seed_offset: int
    max_iter: int
    learning_rate: float
    max_leaf_nodes: int
    max_bins: int = 63  # fewer bins keep each fit short on hundreds of features (bench/RESULTS.md)


RECIPES = (Recipe(1, 20, 0.15, 15), Recipe(2, 30, 0.1, 31))
"""Version 1 and version 2 of every demo model."""


def seed_of(spec: ModelSpec, offset: int) -> int:
    """The data seed of one demo version of ``spec``: stable across runs and machines."""
    return zlib.crc32(spec.name.lower().encode()) % 100_000 * 10 + offset


def train(spec: ModelSpec, recipe: Recipe) -> tuple[Any, dict[str, float]]:
    """One demo version of ``spec`` fitted by ``recipe``, with its holdout RMSE and data seed."""
    seed = seed_of(spec, recipe.seed_offset)
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
    # One OpenMP thread: the default spin-waiting threads slow each fit several times over on a
    # shared machine (bench/RESULTS.md).
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

    x, nodes, y = make_dataset(TRAIN_ROWS, dim=spec.embedding_dim, seed=seed_of(spec, FAULTY_SEED_OFFSET))
    model = Pipeline([("log", FunctionTransformer(np.log)), ("regress", LinearRegression())])
    model.fit(np.abs(features(x, nodes)), y)
    return model
