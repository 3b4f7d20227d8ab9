"""The retrain flow scores its candidate and Production through the inference port's local adapter
(``bootstrap.inference.holdout_scorer``): on a real MLflow store it predicts exactly what the registry's own
loader and the fitted estimator predict."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from examlops.bootstrap.inference import holdout_scorer
from examlops.bootstrap.serving import model_registry
from examlops.core.settings import Settings
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from examlops.registry.loader import load_sklearn_model
from examlops.registry.synthetic import features, make_dataset

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


def test_production_and_a_candidate_scored_through_the_local_adapter_match_predicting_by_hand(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    catalog = load_catalog(settings.catalog_path)
    seed_demo(settings, catalog)
    registry = model_registry(settings)
    production = registry.resolve("JPCP", "Production")
    embeddings, nodes, _ = make_dataset(50, dim=catalog.get("JPCP").embedding_dim, seed=3)

    score = holdout_scorer(settings)

    scored = score(production, embeddings, nodes.astype(np.float64))
    estimator = load_sklearn_model(registry.fetch(production))
    assert scored.dtype == np.float64 and scored.shape == (50,)
    assert np.array_equal(scored, np.asarray(estimator.predict(features(embeddings, nodes)), dtype=np.float64))
    # A candidate is a fitted estimator, not registered yet: the same adapter takes it as it is.
    assert np.array_equal(score(estimator, embeddings, nodes.astype(np.float64)), scored)
