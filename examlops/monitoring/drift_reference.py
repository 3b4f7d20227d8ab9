"""The reference window of a drift report: a model's Production version on its own training distribution.

Contract: ``TrainingReference.reference(model)`` builds the frame from the data source the version's
run logged (``registry.retrain.reference_sample``), never from live traffic, so a drift that began
before a report cannot hide in its own reference; it is cached per version and size as
``cache_dir/MODEL/reference-v<version>-<rows>.csv``.

Failure mode: ``ModelNotFound`` / ``AliasNotFound`` when the model has no Production version,
``RegistryUnavailable`` when MLflow cannot be reached.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd  # type: ignore[import-untyped]  # the venv has no pandas-stubs

from examlops.monitoring.drift import PREDICTION_COLUMN, embedding_stats
from examlops.monitoring.drift_report import Reference, atomic_write

if TYPE_CHECKING:
    from examlops.registry.catalog import Catalog
    from examlops.registry.mlflow_registry import MlflowRegistry

REFERENCE_ROWS = 5_000


class TrainingReference:
    """The reference window of a model: its Production version's predictions on its training distribution."""

    def __init__(self, registry: MlflowRegistry, catalog: Catalog, cache_dir: Path, rows: int = REFERENCE_ROWS) -> None:
        self.registry = registry
        self.catalog = catalog
        self.cache_dir = cache_dir
        self.rows = rows

    def reference(self, model: str) -> Reference:
        from examlops.registry.retrain import reference_sample

        spec = self.catalog.get(model)
        ref = self.registry.resolve(spec.name, "Production")
        label = f"training distribution of version {ref.version} ({self.rows} rows)"
        path = self.cache_dir / spec.name / f"reference-v{ref.version}-{self.rows}.csv"
        if path.is_file():
            return Reference(spec.name, ref.version, label, pd.read_csv(path))
        embeddings, predictions = reference_sample(self.registry, spec, ref, self.rows)
        frame = embedding_stats(embeddings)
        frame.insert(0, PREDICTION_COLUMN, predictions)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, frame.to_csv(index=False))
        return Reference(spec.name, ref.version, label, frame)
