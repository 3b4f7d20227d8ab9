"""The drift report run for one model: the service the drift-report flow and ``exa drift report`` call.

``run_drift_report`` reads the snapshots after the model's drift checkpoint, keeps the served ones of
the version the reference describes, compares them (``drift.compare``), saves ``<stamp>.html`` and
``<stamp>.json`` under ``out_dir / MODEL``, stores the status rows, then advances the checkpoint (and
trims the stream below it). A window is reported once: the checkpoint only moves forward, past the
last entry read. With fewer than ``min_rows`` usable snapshots nothing is reported and the checkpoint
stays, so the next run sees a larger window; a full read of ``max_rows`` with too few usable rows is
skipped past, so it cannot block later windows.

Failure mode: the reference's errors (``NotFound``, ``RegistryUnavailable``) and the stream's
(``StoreUnavailable``) reach the caller before anything is written; files are written atomically.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import pandas as pd  # type: ignore[import-untyped]  # the venv has no pandas-stubs

from examlops.monitoring.drift import COLUMNS, DriftResult, compare

MIN_ROWS = 30
"""Fewer usable snapshots than this in a window: nothing is reported yet."""
MAX_ROWS = 200_000
"""At most this many snapshots are read per run; the rest is the next run's window."""
PAGE = 10_000

Progress = Callable[[str], None]


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
    atomic_write(report.html_path, evidently_snapshot.get_html_str(as_iframe=False))
    summary = report.summary() | {"evidently": evidently_snapshot.dict()}
    atomic_write(report.json_path, json.dumps(summary, indent=2, default=str))
    store.save(report)
    snapshots.advance(model, window.last_id)
    if trim:
        snapshots.trim_below(model, window.last_id)
    return report


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
