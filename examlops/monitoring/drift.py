"""Drift of one model's recent bus traffic against a reference window, with Evidently; and the report run.

The comparison (``compare``) is a pure function of two DataFrames with the
snapshot columns ``prediction``, ``norm``, ``mean`` and ``std``:

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

``run_drift_report`` is the service the drift-report flow and ``exa drift
report`` call for one model: read the snapshots after the model's drift
checkpoint, keep the served ones of the version the reference describes,
compare, save ``<stamp>.html`` and ``<stamp>.json`` under ``out_dir / MODEL``,
store the status rows, then advance the checkpoint (and trim the stream
below it). A window is reported once: the checkpoint only moves forward, past
the last entry read. With fewer than ``min_rows`` usable snapshots nothing is
reported and the checkpoint stays, so the next run sees a larger window.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt
import pandas as pd  # type: ignore[import-untyped]  # the venv has no pandas-stubs

from examlops.core.errors import InvalidInput

if TYPE_CHECKING:
    from examlops.registry.catalog import Catalog
    from examlops.registry.mlflow_registry import MlflowRegistry

PREDICTION_COLUMN = "prediction"
INPUT_COLUMNS = ("norm", "mean", "std")
COLUMNS = (PREDICTION_COLUMN, *INPUT_COLUMNS)
METHOD = "ks"
METHOD_TITLE = "K-S p-value"
THRESHOLD = 0.05
DRIFT_SHARE = 0.5
MIN_ROWS = 30
"""Fewer usable snapshots than this in a window: nothing is reported yet."""
MAX_ROWS = 200_000
"""At most this many snapshots are read per run; the rest is the next run's window."""
PAGE = 10_000

Progress = Callable[[str], None]


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


@dataclass(frozen=True, slots=True)
class Window:
    """The snapshots compared: stream ids (inclusive) and their time range."""

    first_id: str
    last_id: str
    start: datetime
    end: datetime
    read: int
    """Entries read from the stream; ``rows`` of them were usable (served by the reference's version)."""
    rows: int


@dataclass(frozen=True, slots=True)
class Reference:
    model: str
    version: str
    """The version whose served predictions are compared (the one Production points at)."""
    label: str
    frame: pd.DataFrame


@dataclass(frozen=True, slots=True)
class DriftReport:
    model: str
    version: str
    reference: str
    window: Window
    prediction: DriftResult
    input: DriftResult
    html_path: Path
    json_path: Path
    created_at: datetime

    def summary(self) -> dict[str, Any]:
        """The JSON summary saved beside the HTML (paths and times as strings)."""
        data = asdict(self)
        return json.loads(json.dumps(data, default=str))  # type: ignore[no-any-return]  # a JSON object


class SnapshotLike(Protocol):
    @property
    def entry_id(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def ok(self) -> bool: ...
    @property
    def prediction(self) -> float: ...
    @property
    def norm(self) -> float: ...
    @property
    def mean(self) -> float: ...
    @property
    def std(self) -> float: ...
    @property
    def ts(self) -> float: ...


class SnapshotReader(Protocol):
    """What the report needs of the snapshot stream (``monitoring.snapshots.SnapshotStream``)."""

    def checkpoint(self, model: str) -> str | None: ...
    def read(self, model: str, after: str | None = None, count: int = PAGE) -> Sequence[SnapshotLike]: ...
    def advance(self, model: str, entry_id: str) -> str: ...
    def trim_below(self, model: str, entry_id: str) -> int: ...


class ReferenceSource(Protocol):
    def reference(self, model: str) -> Reference:
        """The reference window of the model's current Production version; ``NotFound`` / ``RegistryUnavailable``."""
        ...


class DriftStatusStore(Protocol):
    def save(self, report: DriftReport) -> None: ...


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


def _column_verdicts(result: dict[str, Any]) -> dict[str, ColumnDrift]:
    scores = {m["config"]["column"]: float(m["value"]) for m in result["metrics"]}
    failed = {t["metric_config"]["params"]["column"]: t["status"] == "FAIL" for t in result["tests"]}
    if set(scores) != set(COLUMNS) or set(failed) != set(COLUMNS):
        raise RuntimeError(f"Evidently answered for columns {sorted(scores)} / tests {sorted(failed)}")
    return {column: ColumnDrift(column, scores[column], failed[column]) for column in COLUMNS}


def read_window(
    snapshots: SnapshotReader, model: str, version: str, max_rows: int = MAX_ROWS
) -> tuple[pd.DataFrame, Window | None]:
    """The served snapshots of ``version`` after the checkpoint (at most ``max_rows`` read), and their window.

    The window is None when nothing was read.
    """
    after = snapshots.checkpoint(model)
    columns: dict[str, list[float]] = {c: [] for c in (*COLUMNS, "ts")}
    first_id = last_id = ""
    read = 0
    while read < max_rows:
        page = snapshots.read(model, after, min(PAGE, max_rows - read))
        if not page:
            break
        first_id = first_id or page[0].entry_id
        last_id = after = page[-1].entry_id
        read += len(page)
        for s in page:
            if s.ok and s.version == version:
                for column, value in zip(columns, (s.prediction, s.norm, s.mean, s.std, s.ts), strict=True):
                    columns[column].append(value)
    frame = pd.DataFrame(columns)
    if not read:
        return frame, None
    times = frame["ts"] if len(frame) else pd.Series([0.0])
    start, end = (datetime.fromtimestamp(float(t), UTC) for t in (times.min(), times.max()))
    return frame, Window(first_id, last_id, start, end, read, len(frame))


def run_drift_report(
    model: str,
    snapshots: SnapshotReader,
    references: ReferenceSource,
    store: DriftStatusStore,
    out_dir: Path,
    *,
    min_rows: int = MIN_ROWS,
    max_rows: int = MAX_ROWS,
    trim: bool = True,
    on_progress: Progress | None = None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> DriftReport | None:
    """Report the drift of ``model``'s new snapshots (see the module docstring); None when there were too few."""
    say = on_progress or (lambda _stage: None)
    say("reference")
    reference = references.reference(model)
    say("snapshots")
    current, window = read_window(snapshots, model, reference.version, max_rows)
    if window is None or (window.rows < min_rows and window.read < max_rows):
        return None
    if window.rows < min_rows:  # a full read with too few usable rows: skip past them, or they block forever
        snapshots.advance(model, window.last_id)
        return None
    say("evidently")
    prediction, inputs, evidently_snapshot = compare(current, reference.frame)
    created = clock()
    folder = out_dir / model
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{created:%Y%m%dT%H%M%S}-{window.last_id}"
    report = DriftReport(
        model, reference.version, reference.label, window, prediction, inputs,
        folder / f"{stem}.html", folder / f"{stem}.json", created,
    )  # fmt: skip
    say("save")
    _atomic_write(report.html_path, evidently_snapshot.get_html_str(as_iframe=False))
    summary = report.summary() | {"evidently": evidently_snapshot.dict()}
    _atomic_write(report.json_path, json.dumps(summary, indent=2, default=str))
    store.save(report)
    snapshots.advance(model, window.last_id)
    if trim:
        snapshots.trim_below(model, window.last_id)
    return report


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


REFERENCE_ROWS = 5_000


class TrainingReference:
    """The reference window of a model: its Production version's predictions on that version's training distribution.

    Built from the data source the version's run logged (``registry.retrain.reference_sample``), never from
    live traffic, so a drift that began before a report cannot hide in its own reference. Cached per version
    as ``cache_dir/MODEL/reference-v<version>.csv``.
    """

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
        _atomic_write(path, frame.to_csv(index=False))
        return Reference(spec.name, ref.version, label, frame)


_PROJECT_SCRIPT = """
-- KEYS: snapshot stream. ARGV: start id (inclusive, or '(' id), count. One string per entry:
-- 'id version code prediction norm mean std ts' with '-' for an empty code, or, for a snapshot stored as
-- one field, 'id' newline and that field (the JSON array). Only what the report reads leaves Redis:
-- parsing whole entries in redis-py cost 4-5 times more than this.
local out = {}
for _, e in ipairs(redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])) do
  local f, kv = {}, e[2]
  for i = 1, #kv, 2 do f[kv[i]] = kv[i + 1] end
  if f.s then
    out[#out + 1] = e[1] .. '\\n' .. f.s
  else
    local code = f.code
    if code == nil then code = '?' elseif code == '' then code = '-' end
    out[#out + 1] = table.concat({e[1], f.version or '?', code, f.prediction or 'nan', f.norm or 'nan',
                                  f.mean or 'nan', f.std or 'nan', f.ts or '0'}, ' ')
  end
end
return out
"""


@dataclass(frozen=True, slots=True)
class _Row:
    entry_id: str
    version: str
    ok: bool
    prediction: float
    norm: float
    mean: float
    std: float
    ts: float


class ProjectedSnapshotReader:
    """``SnapshotReader`` over ``monitoring.snapshots.SnapshotStream`` whose ``read`` fetches only the report's fields.

    Checkpoint, advance and trim are the stream's own. Entries that are not snapshots read as not ``ok``.
    """

    def __init__(self, stream: Any) -> None:
        from examlops.monitoring.snapshots import stream_of

        self.stream = stream
        self._stream_of = stream_of
        self._script = stream.redis.register_script(_PROJECT_SCRIPT)

    def checkpoint(self, model: str) -> str | None:
        value: str | None = self.stream.checkpoint(model)
        return value

    def advance(self, model: str, entry_id: str) -> str:
        return str(self.stream.advance(model, entry_id))

    def trim_below(self, model: str, entry_id: str) -> int:
        return int(self.stream.trim_below(model, entry_id))

    def read(self, model: str, after: str | None = None, count: int = PAGE) -> list[_Row]:
        from examlops.adapters.redis import translated

        with translated("reading snapshots"):
            lines = self._script(keys=[self._stream_of(model)], args=["(" + after if after else "-", count])
        rows = []
        for line in lines:
            text = line.decode() if isinstance(line, bytes) else line
            entry_id, newline, packed = text.partition("\n")
            if newline and " " not in entry_id:  # 'id' newline JSON; a legacy line has a space after its id
                rows.append(_packed_row(entry_id, packed))
                continue
            entry_id, version, code, *numbers = text.split(" ")
            try:
                p, n, m, s, ts = (float(x) for x in numbers)
            except ValueError:
                rows.append(_Row(entry_id, version, False, 0.0, 0.0, 0.0, 0.0, 0.0))
                continue
            rows.append(_Row(entry_id, version, code == "-", p, n, m, s, ts))
        return rows


def _packed_row(entry_id: str, packed: str) -> _Row:
    """The row of a snapshot stored as one field; not ``ok`` when it is not a snapshot."""
    from examlops.monitoring.snapshots import PACKED, Snapshot

    try:
        snap = Snapshot.from_fields(entry_id, {PACKED[0]: packed})
    except ValueError:
        return _Row(entry_id, "?", False, 0.0, 0.0, 0.0, 0.0, 0.0)
    return _Row(entry_id, snap.version, snap.ok, snap.prediction, snap.norm, snap.mean, snap.std, snap.ts)
