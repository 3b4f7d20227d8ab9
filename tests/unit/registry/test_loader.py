"""The predict workers' loader reads an MLflow sklearn model folder with scikit-learn and skops alone."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import skops.io
import yaml
from sklearn.linear_model import LinearRegression

from examlops.core.errors import ModelLoadError
from examlops.registry.loader import load_sklearn_model

ROWS = np.arange(6, dtype=np.float64).reshape(2, 3)


def fitted() -> LinearRegression:
    return LinearRegression().fit(np.eye(3), np.array([1.0, 2.0, 3.0]))


def model_folder(root: Path, fmt: str, *, flavor: dict[str, object] | None = None) -> Path:
    """A folder as ``mlflow.sklearn.log_model`` leaves it: ``MLmodel`` with a sklearn flavor and the model file."""
    folder = root / fmt
    folder.mkdir()
    model = fitted()
    if fmt == "skops":
        skops.io.dump(model, folder / "model.skops")
        name = "model.skops"
    else:
        (folder / "model.pkl").write_bytes(pickle.dumps(model))
        name = "model.pkl"
    conf = flavor if flavor is not None else {"pickled_model": name, "serialization_format": fmt}
    (folder / "MLmodel").write_text(yaml.safe_dump({"flavors": {"sklearn": conf, "python_function": {}}}))
    return folder


@pytest.mark.parametrize("fmt", ["skops", "pickle", "cloudpickle"])
def test_each_mlflow_format_loads_and_predicts_like_the_fitted_model(tmp_path: Path, fmt: str) -> None:
    model = load_sklearn_model(str(model_folder(tmp_path, fmt)))
    np.testing.assert_allclose(model.predict(ROWS), fitted().predict(ROWS))


def test_a_folder_without_a_sklearn_flavor_or_with_an_unknown_format_is_a_model_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no readable MLmodel"):
        load_sklearn_model(str(tmp_path))
    with pytest.raises(ModelLoadError, match="no sklearn flavor"):
        load_sklearn_model(str(model_folder(tmp_path, "pickle", flavor={"serialization_format": "pickle"})))
    odd = model_folder(tmp_path, "cloudpickle", flavor={"pickled_model": "model.pkl", "serialization_format": "onnx"})
    with pytest.raises(ModelLoadError, match="unknown format 'onnx'"):
        load_sklearn_model(str(odd))


def test_mlflows_switch_against_deserialization_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", "false")
    with pytest.raises(ModelLoadError, match="MLFLOW_ALLOW_PICKLE_DESERIALIZATION"):
        load_sklearn_model(str(model_folder(tmp_path, "skops")))


def test_loading_imports_no_mlflow(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, "skops")
    code = (
        "import sys; from examlops.registry.loader import load_sklearn_model; "
        f"load_sklearn_model({str(folder)!r}); print(sorted(m for m in sys.modules if m.split('.')[0] == 'mlflow'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"
