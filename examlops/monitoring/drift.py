"""Drift of one window of bus traffic against a reference, with Evidently: a pure comparison.

``compare`` takes two DataFrames with the snapshot columns ``prediction``, ``norm``, ``mean`` and
``std``:

- one Evidently ``ValueDrift`` per column, the test pinned to two-sample
  Kolmogorov-Smirnov (``method="ks"``) at ``THRESHOLD`` 0.05. Unpinned,
  Evidently picks K-S up to 1,000 rows and normed Wasserstein from 5,000, whose
  score means the opposite (drift when high). Here a score is always a K-S
  p-value, and a column drifted when Evidently's test for it fails (p < 0.05);
- **prediction drift**: the ``prediction`` column; the score is its p-value;
- **input drift**: the embedding's norm, mean and standard deviation; drifted
  when at least ``DRIFT_SHARE`` of the three columns drifted (two of three,
  Evidently's dataset-drift rule), and the score is the p-value that decides
  it: the second smallest. One column alone is too easily a false alarm (three
  tests at 5 % each).

Failure mode: ``InvalidInput`` when a column is missing or a frame has fewer than 2 rows; a
``RuntimeError`` when Evidently answers for other columns than asked. The report run that reads the
snapshots and saves the verdicts is ``drift_report``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd  # type: ignore[import-untyped]  # the venv has no pandas-stubs

from examlops.core.errors import InvalidInput

PREDICTION_COLUMN = "prediction"
INPUT_COLUMNS = ("norm", "mean", "std")
COLUMNS = (PREDICTION_COLUMN, *INPUT_COLUMNS)
METHOD = "ks"
METHOD_TITLE = "K-S p-value"
THRESHOLD = 0.05
DRIFT_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class ColumnDrift:
    column: str
    score: float
    """The K-S p-value."""
    drifted: bool


@dataclass(frozen=True, slots=True)
class DriftResult:
    """One verdict: ``kind`` is ``prediction`` or ``input``."""

    kind: str
    drifted: bool
    score: float
    method: str
    threshold: float
    reference_rows: int
    current_rows: int
    columns: tuple[ColumnDrift, ...]


FloatArray = npt.NDArray[np.float64]


def embedding_stats(embeddings: FloatArray) -> pd.DataFrame:
    """``norm``, ``mean`` and population ``std`` of each embedding row, as the bridge's snapshots hold them."""
    emb = np.asarray(embeddings, dtype=np.float64)
    return pd.DataFrame(
        {"norm": np.linalg.norm(emb, axis=1), "mean": emb.mean(axis=1), "std": emb.std(axis=1)},
    )


def compare(current: pd.DataFrame, reference: pd.DataFrame) -> tuple[DriftResult, DriftResult, Any]:
    """Prediction and input drift of ``current`` against ``reference``, and Evidently's snapshot (for the HTML).

    ``InvalidInput`` when a column is missing or either frame has fewer than 2 rows.
    """
    for name, frame in (("current", current), ("reference", reference)):
        missing = [c for c in COLUMNS if c not in frame.columns]
        if missing or len(frame) < 2:
            raise InvalidInput(f"the {name} window needs columns {list(COLUMNS)} and 2 rows (missing {missing})")
    from evidently import Report
    from evidently.metrics import ValueDrift

    report = Report(
        [ValueDrift(column=column, method=METHOD, threshold=THRESHOLD) for column in COLUMNS], include_tests=True
    )
    snapshot = report.run(current[list(COLUMNS)], reference[list(COLUMNS)])  # current first
    by_column = _column_verdicts(snapshot.dict())
    sizes = (len(reference), len(current))
    prediction = by_column[PREDICTION_COLUMN]
    inputs = tuple(by_column[column] for column in INPUT_COLUMNS)
    needed = max(1, math.ceil(DRIFT_SHARE * len(inputs)))
    deciding = sorted(c.score for c in inputs)[needed - 1]
    return (
        DriftResult("prediction", prediction.drifted, prediction.score, METHOD, THRESHOLD, *sizes, (prediction,)),
        DriftResult("input", sum(c.drifted for c in inputs) >= needed, deciding, METHOD, THRESHOLD, *sizes, inputs),
        snapshot,
    )


def prediction_drift(current: Sequence[float], reference: Sequence[float]) -> tuple[float, float]:
    """The two-sample K-S test of two samples of predictions (the canary's drift gate): its p-value, by
    Evidently's ``ValueDrift``, and its distance (the largest gap between the two empirical distributions,
    scipy's ``ks_2samp`` statistic), which says how large a difference the p-value found.

    ``InvalidInput`` when a sample has fewer than 2 values.
    """
    if min(len(current), len(reference)) < 2:
        raise InvalidInput("a drift test needs 2 predictions on each side")
    from evidently import Report
    from evidently.metrics import ValueDrift
    from scipy.stats import ks_2samp  # type: ignore[import-untyped]  # scipy ships no type information here

    report = Report([ValueDrift(column=PREDICTION_COLUMN, method=METHOD, threshold=THRESHOLD)])
    snapshot = report.run(
        pd.DataFrame({PREDICTION_COLUMN: list(current)}), pd.DataFrame({PREDICTION_COLUMN: list(reference)})
    )
    distance = float(ks_2samp(list(current), list(reference)).statistic)
    return float(snapshot.dict()["metrics"][0]["value"]), distance


def _column_verdicts(result: dict[str, Any]) -> dict[str, ColumnDrift]:
    scores = {m["config"]["column"]: float(m["value"]) for m in result["metrics"]}
    failed = {t["metric_config"]["params"]["column"]: t["status"] == "FAIL" for t in result["tests"]}
    if set(scores) != set(COLUMNS) or set(failed) != set(COLUMNS):
        raise RuntimeError(f"Evidently answered for columns {sorted(scores)} / tests {sorted(failed)}")
    return {column: ColumnDrift(column, scores[column], failed[column]) for column in COLUMNS}
