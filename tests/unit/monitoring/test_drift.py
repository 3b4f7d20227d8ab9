"""The drift computation (real Evidently, pinned K-S) and the report run with fakes of the stream and the store."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from examlops.core.errors import InvalidInput
from examlops.monitoring.drift import INPUT_COLUMNS, compare, embedding_stats
from examlops.monitoring.drift_report import DriftReport, Reference, run_drift_report
from examlops.registry.synthetic import make_dataset

pytestmark = [
    # Evidently 0.7 and its plotly/pandas stack warn about their own internals.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning:evidently.*"),
]


def frame(n: int, seed: int, shift: float = 0.0) -> pd.DataFrame:
    emb, _, y = make_dataset(n, dim=64, seed=seed, shift=shift)
    stats = embedding_stats(emb)
    stats.insert(0, "prediction", y + shift)
    return stats


def test_same_distribution_is_not_drift_and_scores_are_ks_p_values() -> None:
    prediction, inputs, _ = compare(frame(2_000, 1), frame(5_000, 2))
    assert not prediction.drifted and not inputs.drifted
    assert prediction.method == "ks" and prediction.threshold == 0.05
    assert 0.05 <= prediction.score <= 1.0
    assert [c.column for c in inputs.columns] == list(INPUT_COLUMNS)
    assert (prediction.current_rows, prediction.reference_rows) == (2_000, 5_000)


@pytest.mark.parametrize("rows", [300, 20_000])  # both sides of Evidently's own K-S / Wasserstein switch
def test_shifted_data_is_drift_at_any_row_count(rows: int) -> None:
    prediction, inputs, _ = compare(frame(rows, 3, shift=0.5), frame(5_000, 4))
    assert prediction.drifted and inputs.drifted
    assert prediction.score < 0.05 and inputs.score < 0.05
    assert all(c.drifted for c in inputs.columns)


def test_input_drift_needs_two_of_three_columns_and_scores_by_the_deciding_one() -> None:
    reference = frame(3_000, 5)
    current = frame(3_000, 6)
    current["norm"] = current["norm"] * 1.5  # one column moved
    _, inputs, _ = compare(current, reference)
    by_column = {c.column: c for c in inputs.columns}
    assert by_column["norm"].drifted
    assert not inputs.drifted
    assert inputs.score == sorted(c.score for c in inputs.columns)[1]


def test_a_window_without_the_columns_is_refused() -> None:
    with pytest.raises(InvalidInput):
        compare(frame(100, 1).drop(columns=["std"]), frame(100, 2))


@dataclass(frozen=True)
class FakeSnapshot:
    entry_id: str
    version: str
    prediction: float
    norm: float
    mean: float
    std: float
    ts: float
    code: str = ""

    @property
    def ok(self) -> bool:
        return not self.code


class FakeStream:
    """A snapshot stream of one model with a checkpoint that only moves forward, like the Redis one."""

    def __init__(self) -> None:
        self.entries: list[FakeSnapshot] = []
        self.checkpoints: dict[str, str] = {}
        self.trimmed: list[str] = []

    def add(self, data: pd.DataFrame, version: str = "1", code: str = "") -> None:
        for row in data.itertuples(index=False):
            n = len(self.entries) + 1
            self.entries.append(
                FakeSnapshot(f"{n}-0", version, row.prediction, row.norm, row.mean, row.std, 1_700_000_000.0 + n, code)
            )

    def checkpoint(self, model: str) -> str | None:
        return self.checkpoints.get(model)

    def read(self, model: str, after: str | None = None, count: int = 10_000) -> list[FakeSnapshot]:
        start = 0 if after is None else int(after.split("-")[0])
        return self.entries[start : start + count]

    def advance(self, model: str, entry_id: str) -> str:
        current = self.checkpoints.get(model)
        if current is None or int(entry_id.split("-")[0]) > int(current.split("-")[0]):
            self.checkpoints[model] = entry_id
        return self.checkpoints[model]

    def trim_below(self, model: str, entry_id: str) -> int:
        self.trimmed.append(entry_id)
        return 0


class FixedReference:
    def __init__(self, data: pd.DataFrame, version: str = "1") -> None:
        self.data = data
        self.version = version

    def reference(self, model: str) -> Reference:
        return Reference(model, self.version, "test reference", self.data)


class RecordingStore:
    def __init__(self) -> None:
        self.saved: list[DriftReport] = []

    def save(self, report: DriftReport) -> None:
        self.saved.append(report)


def run(stream: FakeStream, store: RecordingStore, out: Path, reference: pd.DataFrame) -> DriftReport | None:
    return run_drift_report(
        "JPCP", stream, FixedReference(reference), store, out, min_rows=50,
        clock=lambda: datetime(2025, 1, 1, tzinfo=UTC),
    )  # fmt: skip


def test_report_saves_html_and_json_stores_rows_and_advances_the_checkpoint(tmp_path: Path) -> None:
    stream, store = FakeStream(), RecordingStore()
    stream.add(frame(400, 7, shift=0.5))
    report = run(stream, store, tmp_path, frame(2_000, 8))
    assert report is not None and store.saved == [report]
    assert report.prediction.drifted and report.input.drifted
    assert report.html_path.parent == tmp_path / "JPCP" and "<html" in report.html_path.read_text()
    summary = json.loads(report.json_path.read_text())
    assert summary["prediction"]["drifted"] is True and summary["window"]["rows"] == 400
    assert stream.checkpoints["JPCP"] == "400-0" and stream.trimmed == ["400-0"]


def test_a_window_is_never_reported_twice(tmp_path: Path) -> None:
    stream, store = FakeStream(), RecordingStore()
    stream.add(frame(200, 9))
    first = run(stream, store, tmp_path, frame(2_000, 10))
    assert first is not None and (first.window.first_id, first.window.last_id) == ("1-0", "200-0")
    assert run(stream, store, tmp_path, frame(2_000, 10)) is None
    stream.add(frame(100, 11))
    second = run(stream, store, tmp_path, frame(2_000, 10))
    assert second is not None and (second.window.first_id, second.window.last_id) == ("201-0", "300-0")
    assert len(store.saved) == 2


def test_too_few_snapshots_wait_for_the_next_run_without_moving_the_checkpoint(tmp_path: Path) -> None:
    stream, store = FakeStream(), RecordingStore()
    stream.add(frame(20, 12))
    assert run(stream, store, tmp_path, frame(2_000, 13)) is None
    assert stream.checkpoints == {} and store.saved == []
    stream.add(frame(40, 14))
    report = run(stream, store, tmp_path, frame(2_000, 13))
    assert report is not None and report.window.rows == 60


def test_only_served_snapshots_of_the_reference_version_are_compared(tmp_path: Path) -> None:
    stream, store = FakeStream(), RecordingStore()
    stream.add(frame(100, 15))
    stream.add(frame(100, 16, shift=2.0), version="2")  # Canary traffic: another model, not drift
    stream.add(frame(30, 17, shift=2.0), code="invalid_input")
    report = run(stream, store, tmp_path, frame(2_000, 18))
    assert report is not None
    assert (report.window.read, report.window.rows) == (230, 100)
    assert not report.prediction.drifted


def test_embedding_stats_match_the_bridge_snapshot_definition() -> None:
    from examlops.monitoring.snapshots import embedding_stats as snapshot_stats

    emb = np.random.default_rng(0).standard_normal((5, 384))
    ours = embedding_stats(emb)
    for i in range(5):
        assert tuple(ours.iloc[i]) == pytest.approx(snapshot_stats(list(emb[i])))
