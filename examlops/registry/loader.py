"""Load a logged scikit-learn model in a predict worker process, with scikit-learn (and skops) alone.

``load_sklearn_model`` is the ``ModelLoader`` of the predict pool and of the Ray replicas: a top-level
function, sent to worker processes by reference. The parent resolved the alias and fetched the version's
artifact (``MlflowRegistry.fetch``): ``location`` is a local MLflow model folder, and this module reads it
the way ``mlflow.sklearn.load_model`` does, without importing mlflow (2-3 s and ~250 MB a process):
the ``sklearn`` flavor of its ``MLmodel`` names the file (``pickled_model``), its format (``skops``,
``cloudpickle`` or ``pickle``), the skops types trusted when it was logged and any logged code folder.
It returns the raw estimator, not a pyfunc wrapper, so ``predict`` on an ``(n, 385)`` float64 array skips
MLflow's per-call schema checks.

Trust is MLflow's: the types a skops file may build are the ones its own ``MLmodel`` lists, and a pickle
runs code; models come from the site's registry. ``MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false`` refuses
every format, as MLflow does.

``WARM_MODULES`` are what a worker needs to load and run the catalog's models: the pool's warm parent (a
forkserver) imports them once, and each worker forked from it starts with them in memory.
"""

from __future__ import annotations

import numbers
import os
import pickle
import sys
from pathlib import Path
from typing import Any, Protocol

import yaml

from examlops.core.errors import ModelLoadError

WARM_MODULES = (
    "examlops.registry.loader",
    "numpy",
    "sklearn.ensemble",
    "sklearn.linear_model",
    "sklearn.pipeline",
    "sklearn.preprocessing",
    "skops.io",
    "cloudpickle",
    "threadpoolctl",
)
"""Imported once by the predict pool's warm parent, so that no worker pays for them again."""

FORMATS = ("skops", "cloudpickle", "pickle")


class Estimator(Protocol):
    """What a loaded model offers; structurally the serving port's ``Predictor``.

    Declared here because ``registry`` sits below ``serving`` in the layers and
    may not import it.
    """

    def predict(self, rows: Any) -> Any: ...


def load_sklearn_model(location: str) -> Estimator:
    """Load the MLflow sklearn model in the local folder ``location`` (the one holding ``MLmodel``).

    Raises ``ModelLoadError`` when the folder has no readable ``MLmodel`` with a ``sklearn`` flavor, names
    an unknown format, is refused by ``MLFLOW_ALLOW_PICKLE_DESERIALIZATION``, or holds an object that
    cannot predict; whatever skops or pickle raise for a missing or corrupt file (the pool turns it into
    ``ModelLoadError`` too).

    Side effect: limits OpenMP to one thread in the calling process (each worker predicts on one core;
    scikit-learn's tree predictors use OpenMP).
    """
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]  # ships no type information

    folder = Path(location)
    flavor = _sklearn_flavor(folder)
    fmt = str(flavor.get("serialization_format") or "pickle")
    if fmt not in FORMATS:
        raise ModelLoadError(f"the model in {location} is in an unknown format {fmt!r}")
    if os.environ.get("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", "true").strip().lower() in ("false", "0"):
        raise ModelLoadError(f"loading the model in {location} is refused: MLFLOW_ALLOW_PICKLE_DESERIALIZATION")
    if flavor.get("code"):  # a model logged with code_paths imports from them, as mlflow.sklearn would
        sys.path.insert(0, str(folder / str(flavor["code"])))
    model = _read(folder / str(flavor["pickled_model"]), fmt, flavor.get("skops_trusted_types"))
    # Process-wide on purpose: parallelism comes from the pool's processes; OpenMP threads on top
    # oversubscribe the cores (bench/RESULTS.md).
    threadpool_limits(limits=1, user_api="openmp")
    if not callable(getattr(model, "predict", None)):
        raise ModelLoadError(f"the model in {location} has no predict method ({type(model).__name__})")
    loaded: Estimator = model
    return loaded


def _sklearn_flavor(folder: Path) -> dict[str, Any]:
    try:
        document = yaml.safe_load((folder / "MLmodel").read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ModelLoadError(f"{folder} holds no readable MLmodel: {exc}") from exc
    flavor = (document or {}).get("flavors", {}).get("sklearn") if isinstance(document, dict) else None
    if not isinstance(flavor, dict) or not flavor.get("pickled_model"):
        raise ModelLoadError(f"the model in {folder} has no sklearn flavor")
    return flavor


def _read(path: Path, fmt: str, trusted: Any) -> Any:
    if fmt == "skops":
        import skops.io

        return skops.io.load(path, trusted=list(trusted) if trusted else None)
    with path.open("rb") as file:
        if fmt == "cloudpickle":
            import cloudpickle

            return cloudpickle.load(file)
        return pickle.load(file)


def expected_features(predictor: object) -> int | None:
    """How many columns the model was fitted on (``n_features_in_``), or None when it does not say."""
    value = getattr(predictor, "n_features_in_", None)
    return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else None
