"""The shipped loaders and the scikit-learn shim: rows to a float matrix by field order, floats to outputs."""

from __future__ import annotations

from pathlib import Path

import joblib
import numpy as np
import pytest
import skops.io
import skops.io.exceptions
from sklearn.linear_model import LinearRegression

from examlops.inference.loaders import SklearnBatchPredictor, joblib_file, rows_to_matrix, skops_file


def test_rows_become_a_float_matrix_in_field_order_with_lists_flattened() -> None:
    rows = [{"embedding": [0.5, 1.5], "node_count": 3}, {"embedding": [2, 3], "node_count": 4}]
    matrix = rows_to_matrix(rows)
    assert matrix.dtype == np.float64
    assert matrix.tolist() == [[0.5, 1.5, 3.0], [2.0, 3.0, 4.0]]


def test_rows_of_different_widths_are_refused() -> None:
    with pytest.raises(ValueError, match="different numbers of columns"):
        rows_to_matrix([{"embedding": [1.0]}, {"embedding": [1.0, 2.0]}])


class Fixed:
    def __init__(self, answer: object) -> None:
        self.answer = answer

    def predict(self, matrix: object) -> object:
        return self.answer


def test_one_value_per_row_fills_the_output_field_and_several_make_a_list() -> None:
    rows = [{"x": 1.0}, {"x": 2.0}]
    assert SklearnBatchPredictor(Fixed(np.array([0.25, 0.5])), "score").predict_batch(rows) == [
        {"score": 0.25},
        {"score": 0.5},
    ]
    assert SklearnBatchPredictor(Fixed(np.array([[1, 2], [3, 4]])), "probs").predict_batch(rows) == [
        {"probs": [1.0, 2.0]},
        {"probs": [3.0, 4.0]},
    ]


def _fitted() -> LinearRegression:
    x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    return LinearRegression().fit(x, x @ np.array([2.0, 3.0]))


def test_skops_and_joblib_files_load_into_the_same_predictor(tmp_path: Path) -> None:
    model = _fitted()
    skops.io.dump(model, tmp_path / "m.skops")
    joblib.dump(model, tmp_path / "m.joblib")
    rows = [{"a": 1.0, "b": 2.0}]
    from_skops = skops_file(tmp_path / "m.skops", output_field="y")().predict_batch(rows)
    from_joblib = joblib_file(tmp_path / "m.joblib", output_field="y")().predict_batch(rows)
    assert from_skops == from_joblib
    assert from_skops[0]["y"] == pytest.approx(8.0)


def test_a_skops_file_holding_an_untrusted_type_is_refused(tmp_path: Path) -> None:
    skops.io.dump(Fixed(0.0), tmp_path / "m.skops")
    with pytest.raises(skops.io.exceptions.UntrustedTypesFoundException):
        skops_file(tmp_path / "m.skops")()
