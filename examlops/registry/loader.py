"""Load a logged scikit-learn model in a predict worker process.

``load_sklearn_model`` is the ``ModelLoader`` of the predict pool: a top-level
function, sent to worker processes by reference. It returns the raw
estimator, not a pyfunc wrapper, so ``predict`` on an ``(n, 385)`` float64
array skips MLflow's per-call schema checks. mlflow is imported on the first
call, inside the worker, never at import time.
"""

from __future__ import annotations

import numbers
from typing import Any, Protocol

from examlops.core.errors import ModelLoadError


class Estimator(Protocol):
    """What a loaded model offers; structurally the serving port's ``Predictor``.

    Declared here because ``registry`` sits below ``serving`` in the layers and
    may not import it.
    """

    def predict(self, rows: Any) -> Any: ...


def load_sklearn_model(location: str) -> Estimator:
    """Load the MLflow sklearn model in the local folder ``location`` (the one holding ``MLmodel``).

    Raises whatever MLflow raises for a missing or corrupt folder (the pool
    turns it into ``ModelLoadError``), and ``ModelLoadError`` itself when the
    loaded object cannot predict. The skops types trusted when the model was
    logged are read back from its ``MLmodel`` file.

    Side effect: limits OpenMP to one thread in the calling process (each
    worker predicts on one core; scikit-learn's tree predictors use OpenMP).
    """
    from examlops.registry.mlflow_client import import_mlflow

    import_mlflow()
    import mlflow.sklearn
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]  # ships no type information

    model = mlflow.sklearn.load_model(location)
    # Process-wide on purpose: parallelism comes from the pool's processes; OpenMP threads on top
    # oversubscribe the cores (bench/RESULTS.md).
    threadpool_limits(limits=1, user_api="openmp")
    if not callable(getattr(model, "predict", None)):
        raise ModelLoadError(f"the model in {location} has no predict method ({type(model).__name__})")
    loaded: Estimator = model
    return loaded


def expected_features(predictor: object) -> int | None:
    """How many columns the model was fitted on (``n_features_in_``), or None when it does not say."""
    value = getattr(predictor, "n_features_in_", None)
    return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else None
