"""Models that break at load time, logged by value so that worker processes need not import tests."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin


class ExplodingRegressor(RegressorMixin, BaseEstimator):  # type: ignore[misc]
    """Pickles fine and raises while it is unpickled: "any exception while loading"."""

    def fit(self, x: Any, y: Any) -> ExplodingRegressor:
        self.n_features_in_ = np.asarray(x).shape[1]
        return self

    def predict(self, x: Any) -> Any:
        return np.zeros(len(x))

    def __setstate__(self, state: dict[str, Any]) -> None:
        raise RuntimeError("this model explodes while it is loaded")
