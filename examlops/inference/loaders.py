"""Loaders for the local adapter: callables returning an object with a synchronous ``predict_batch``.

The local adapter's contract is a callable, not an artifact format (seed 002). A ``Loader`` takes no
argument and returns a ``BatchPredictor``, whose ``predict_batch(instances)`` gets the batch as input
mappings (JSON-able dicts in the input model's field order, exactly the rows the port sends any adapter)
and returns one output mapping per instance, in order.

The framework never deserialises an artifact by itself: unpickling is arbitrary code execution, so that
trust decision stays in the loader you choose. The shipped ones say what they trust:

- ``mlflow_model(uri, tracking_uri=...)``: a registered version (``models:/JPCP@Production``,
  ``models:/JPCP/3``) or any MLflow artifact URI, loaded as examlops' registry loads a version: the
  artifact folder fetched through ``MlflowRegistry`` (a local store's folder as is, a remote one
  downloaded once into ``cache_dir``), then ``mlflow.sklearn.load_model``, which trusts only the skops
  types recorded in the model's ``MLmodel`` when it was logged (a cloudpickle model is unpickled: MLflow's
  flavour decides, as it does for serving).
- ``skops_file(path, trusted_types=...)``: ``skops.io.load`` trusting skops' defaults plus the types named.
- ``joblib_file(path)``: ``joblib.load``, i.e. an unpickle; use it only for files you wrote yourself.

Each wraps the estimator in ``SklearnBatchPredictor``: rows become a 2-D float64 array by field order
(lists flattened in place, so ``{embedding: [...384], node_count: 3}`` is 385 columns, the serving
pipeline's layout), and each prediction becomes ``{output_field: float}`` (a row of several values
becomes ``{output_field: [floats]}``). Libraries are imported when a loader runs, never at import time.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from examlops.registry.mlflow_client import HttpLimits


class BatchPredictor(Protocol):
    def predict_batch(self, instances: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]: ...


Loader = Callable[[], BatchPredictor]


def _flatten(value: Any, out: list[float]) -> None:
    if isinstance(value, (list, tuple)):
        for item in value:
            _flatten(item, out)
    else:
        out.append(float(value))


def rows_to_matrix(rows: Sequence[Mapping[str, Any]]) -> Any:
    """A float64 ``(len(rows), n)`` array: each row's values in field order, lists flattened.

    ``ValueError`` when a value is not a number or the rows flatten to different widths.
    """
    import numpy as np

    flat: list[list[float]] = []
    for row in rows:
        values: list[float] = []
        for value in row.values():
            _flatten(value, values)
        flat.append(values)
    if len({len(values) for values in flat}) > 1:
        raise ValueError("the rows flatten to different numbers of columns")
    return np.asarray(flat, dtype=np.float64).reshape(len(flat), len(flat[0]) if flat else 0)


class SklearnBatchPredictor:
    """A scikit-learn estimator (anything with ``predict(2-D array)``) behind ``predict_batch``."""

    def __init__(self, estimator: Any, output_field: str) -> None:
        if not callable(getattr(estimator, "predict", None)):
            raise TypeError(f"{type(estimator).__name__} has no predict method")
        self.estimator = estimator
        self.output_field = output_field

    def predict_batch(self, instances: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        import numpy as np

        predictions = np.asarray(self.estimator.predict(rows_to_matrix(instances)), dtype=np.float64)
        if predictions.ndim <= 1 or predictions.shape[1:] == (1,):
            return [{self.output_field: float(value)} for value in predictions.reshape(-1)]
        return [{self.output_field: [float(v) for v in row.reshape(-1)]} for row in predictions]


def _parse_models_uri(uri: str) -> tuple[str, str | None, str | None] | None:
    """``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` as (name, alias, version); None otherwise."""
    if not uri.startswith("models:/"):
        return None
    rest = uri.removeprefix("models:/").strip("/")
    if "@" in rest:
        name, alias = rest.split("@", 1)
        return name, alias, None
    name, _, version = rest.partition("/")
    if not version:
        raise ValueError(f"{uri!r} names no version or alias (models:/NAME@ALIAS or models:/NAME/VERSION)")
    return name, None, version


def mlflow_model(
    model_uri: str,
    *,
    tracking_uri: str,
    output_field: str = "prediction",
    cache_dir: Path | None = None,
    limits: HttpLimits | None = None,
) -> Loader:
    """A loader for an MLflow scikit-learn model; see the module docstring. MLflow errors propagate. ``limits``
    bound each HTTP request to an MLflow server (the platform passes ``bootstrap.serving.mlflow_limits``);
    without them MLflow's own defaults apply, which wait minutes for a server that does not answer."""

    def load() -> BatchPredictor:
        from examlops.registry.mlflow_client import bound_http, import_mlflow
        from examlops.registry.mlflow_registry import MlflowRegistry

        import_mlflow()
        import mlflow.artifacts
        import mlflow.sklearn

        cache = cache_dir or Path(tempfile.gettempdir()) / "examlops-inference-models"
        parsed = _parse_models_uri(model_uri)
        if parsed is None:
            if limits is not None:
                bound_http(limits)
            location = mlflow.artifacts.download_artifacts(
                artifact_uri=model_uri, tracking_uri=tracking_uri, dst_path=str(cache)
            )
        else:
            name, alias, version = parsed
            registry = MlflowRegistry(tracking_uri, cache, limits=limits)
            ref = registry.resolve(name, alias) if alias is not None else registry.version(name, str(version))
            location = registry.fetch(ref)
        return SklearnBatchPredictor(mlflow.sklearn.load_model(location), output_field)

    return load


def skops_file(path: str | Path, *, trusted_types: Sequence[str] = (), output_field: str = "prediction") -> Loader:
    """A loader for a skops file trusting skops' defaults plus ``trusted_types``."""

    def load() -> BatchPredictor:
        import skops.io

        return SklearnBatchPredictor(skops.io.load(Path(path), trusted=list(trusted_types)), output_field)

    return load


def joblib_file(path: str | Path, *, output_field: str = "prediction") -> Loader:
    """A loader for a joblib file: an unpickle, for files you wrote yourself."""

    def load() -> BatchPredictor:
        import joblib  # type: ignore[import-untyped]  # ships no type information

        return SklearnBatchPredictor(joblib.load(Path(path)), output_field)

    return load
