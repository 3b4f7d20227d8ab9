"""A model slower than any sane limit, logged by value so that worker processes need not import tests."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin


class SleepyRegressor(RegressorMixin, BaseEstimator):  # type: ignore[misc]
    def __init__(self, seconds: float = 60.0) -> None:
        self.seconds = seconds

    def fit(self, x: Any, y: Any) -> SleepyRegressor:
        self.n_features_in_ = np.asarray(x).shape[1]
        return self

    def predict(self, x: Any) -> Any:
        time.sleep(self.seconds)
        return np.zeros(len(x))
