"""The retrain flow scores Production through the inference port's local adapter (``bootstrap.inference
.version_scorer``): on a real MLflow store it predicts exactly what the registry's own loader predicts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from examlops.bootstrap.inference import version_scorer
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


def test_production_scored_through_the_local_adapter_matches_the_registrys_loader(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    catalog = load_catalog(settings.catalog_path)
    seed_demo(settings, catalog)
    registry = model_registry(settings)
    production = registry.resolve("JPCP", "Production")
    embeddings, nodes, _ = make_dataset(50, dim=catalog.get("JPCP").embedding_dim, seed=3)

    scored = version_scorer(settings)(production, embeddings, nodes.astype(np.float64))

    by_hand = load_sklearn_model(registry.fetch(production)).predict(features(embeddings, nodes))
    assert scored.dtype == np.float64 and scored.shape == (50,)
    assert np.array_equal(scored, np.asarray(by_hand, dtype=np.float64))
