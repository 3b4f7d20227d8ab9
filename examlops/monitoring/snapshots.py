"""Drift snapshots: one per bus inference, on one Redis stream per model, read and trimmed by the drift flow.

Keys (``{model}`` is the catalog name lower-cased)::

    examlops:snapshots:{model}           stream of snapshots; trimmed below the drift checkpoint, and past
                                         the maximum age (``recording.snapshot_max_age_s``) by retention
    examlops:snapshots:models            set of the model names that have a snapshot stream
    examlops:drift:checkpoint:{model}    the id of the last entry the drift flow consumed; only moves forward

A snapshot is one stream field, ``s``: the JSON array of its values in the
order of ``FIELDS`` (``model alias version run_id prediction norm mean std
node_count job_id user_id ts status code``), texts as strings and the rest as
numbers (one field costs Redis less per XADD than fourteen; ``bench/RESULTS.md``).
``code`` is empty for a served prediction and the error's code otherwise
(``invalid_input``, ``inference_failed``...): the drift flow reads
``Snapshot.ok`` ones. ``norm``, ``mean`` and ``std`` (population) are the
embedding's; 0 for an empty one.

The snapshot is written by the audit append script, atomically with its
``inference.served`` event (see ``audit.chain.SideWrite``), so the two streams stay 1:1
until retention trims them, each by its own rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from examlops.adapters.redis import translated
from examlops.core.records import embedding_stats, stored_float
from examlops.monitoring.audit.chain import SideWrite

PREFIX = "examlops:snapshots:"
MODELS = "examlops:snapshots:models"
CHECKPOINT_PREFIX = "examlops:drift:checkpoint:"
FIELDS = (
    "model", "alias", "version", "run_id", "prediction", "norm", "mean", "std",
    "node_count", "job_id", "user_id", "ts", "status", "code",
)  # fmt: skip
PACKED = ("s",)
"""The stream field names of a snapshot: one field holding the JSON array of the ``FIELDS`` values."""
_TEXTS = (0, 1, 2, 3, 9, 10, 13)
_FLOATS = (4, 5, 6, 7, 11)
_INTS = (8, 12)


def stream_of(model: str) -> str:
    return PREFIX + model.lower()


def checkpoint_key(model: str) -> str:
    return CHECKPOINT_PREFIX + model.lower()


@dataclass(frozen=True, slots=True)
class Snapshot:
    model: str
    alias: str
    version: str
    run_id: str
    prediction: float
    norm: float
    mean: float
    std: float
    node_count: int
    job_id: str
    user_id: str
    ts: float
    status: int
    code: str
    entry_id: str = ""

    @property
    def ok(self) -> bool:
        return not self.code

    def fields(self) -> dict[str, str]:
        """The stream entry's fields (``PACKED``)."""
        return {PACKED[0]: packed(self.row())}

    def row(self) -> tuple[str | float | int, ...]:
        """The values in ``FIELDS`` order."""
        return (
            self.model, self.alias, self.version, self.run_id, self.prediction, self.norm, self.mean, self.std,
            self.node_count, self.job_id, self.user_id, self.ts, self.status, self.code,
        )  # fmt: skip

    @classmethod
    def from_fields(cls, entry_id: str, fields: Mapping[str, str]) -> Snapshot:
        """``KeyError`` / ``ValueError`` for an entry that is not a snapshot."""
        try:
            row = orjson.loads(fields[PACKED[0]])
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"snapshot {entry_id} is not JSON") from exc
        if type(row) is not list or len(row) != len(FIELDS):
            raise ValueError(f"snapshot {entry_id} is not an array of {len(FIELDS)} values")
        if not all(type(row[i]) is str for i in _TEXTS):
            raise ValueError(f"snapshot {entry_id}: a text field is not a string")
        if not all(type(row[i]) is int for i in _INTS):
            raise ValueError(f"snapshot {entry_id}: a count or status is not an integer")
        model, alias, version, run_id, prediction, norm, mean, std, nodes, job_id, user_id, ts, status, code = row
        prediction, norm, mean, std, ts = map(stored_float, (prediction, norm, mean, std, ts))
        return cls(model, alias, version, run_id, prediction, norm, mean, std, nodes, job_id, user_id, ts, status, code,
                   entry_id)  # fmt: skip

    def side_write(self) -> SideWrite:
        return SideWrite(stream_of(self.model), PACKED, (packed(self.row()),), MODELS, self.model.lower())


def packed(row: tuple[str | float | int, ...]) -> str:
    """A snapshot's ``s`` field: its values as a JSON array (floats as their shortest repr, like ``repr``).

    JSON has no infinity or NaN (orjson would write null): such a float is stored as its repr, a string
    (the statistics of an embedding of huge finite values can overflow to inf).
    """
    if not all(map(math.isfinite, [row[i] for i in _FLOATS])):  # type: ignore[arg-type]  # floats by position
        row = tuple(repr(v) if i in _FLOATS and not math.isfinite(v) else v for i, v in enumerate(row))  # type: ignore[arg-type]
    return orjson.dumps(row).decode()


def number(value: Any) -> float:
    """A finite int or float as a float; 0.0 for anything else (a missing, NaN or non-numeric prediction)."""
    if type(value) in (int, float) and math.isfinite(value):
        return float(value)
    return 0.0


def snapshot_of(
    *,
    model: str,
    reply: Mapping[str, Any],
    status: int,
    embedding: Sequence[float],
    node_count: int,
    job_id: str,
    user_id: str,
    ts: float,
) -> Snapshot:
    """The snapshot of one bus reply (the bridge's reply body, success or error)."""
    norm, mean, std = embedding_stats(embedding)
    code = "" if reply.get("error") is None else str(reply.get("code") or "error")
    return Snapshot(
        model=model,
        alias=str(reply.get("alias") or ""),
        version=str(reply.get("version") or ""),
        run_id=str(reply.get("run_id") or ""),
        prediction=number(reply.get("prediction")),
        norm=norm,
        mean=mean,
        std=std,
        node_count=node_count,
        job_id=job_id,
        user_id=user_id,
        ts=ts,
        status=status,
        code=code,
    )


TRIM_SCRIPT = """
-- KEYS: snapshot stream, checkpoint key. ARGV: the bound asked for. Trims below min(bound, checkpoint).
local function parse(id)
  local ms, sq = string.match(id, '^(%d+)-(%d+)$')
  if not ms then ms, sq = string.match(id, '^(%d+)$'), '0' end
  if not ms then return nil end
  return {tonumber(ms), tonumber(sq)}
end
local function less(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end
local checkpoint = redis.call('GET', KEYS[2])
if not checkpoint then return 0 end
local asked, done = parse(ARGV[1]), parse(checkpoint)
if not asked or not done then return redis.error_reply('examlops: not a stream id') end
local bound = ARGV[1]
if less(done, asked) then bound = checkpoint end
return redis.call('XTRIM', KEYS[1], 'MINID', bound)
"""

ADVANCE_SCRIPT = """
-- KEYS: checkpoint key. ARGV: entry id. Moves the checkpoint forward only; returns the checkpoint.
local function parse(id)
  local ms, sq = string.match(id, '^(%d+)-(%d+)$')
  if not ms then return nil end
  return {tonumber(ms), tonumber(sq)}
end
local new = parse(ARGV[1])
if not new then return redis.error_reply('examlops: not a stream id') end
local current = redis.call('GET', KEYS[1])
local old = current and parse(current)
if old and (new[1] < old[1] or (new[1] == old[1] and new[2] <= old[2])) then return current end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
"""


class SnapshotStream:
    """What the drift flow uses: read from the checkpoint, advance it, trim below it. ``StoreUnavailable``."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._trim = client.register_script(TRIM_SCRIPT)
        self._advance = client.register_script(ADVANCE_SCRIPT)

    def models(self) -> list[str]:
        with translated("listing snapshot streams"):
            found: Any = self.redis.smembers(MODELS)
        return sorted(str(m) for m in found)

    def checkpoint(self, model: str) -> str | None:
        with translated("reading the drift checkpoint"):
            value: Any = self.redis.get(checkpoint_key(model))
        return None if value is None else str(value)

    def read(self, model: str, after: str | None = None, count: int = 10_000) -> list[Snapshot]:
        """Snapshots after entry ``after`` (exclusive; the start of the stream when None), oldest first.

        Entries that are not snapshots are skipped.
        """
        with translated("reading snapshots"):
            found: Any = self.redis.xrange(stream_of(model), min="(" + after if after else "-", count=count)
        snapshots = []
        for entry_id, fields in found:
            try:
                snapshots.append(Snapshot.from_fields(entry_id, fields))
            except (KeyError, ValueError, TypeError):
                continue
        return snapshots

    def predictions_since(self, model: str, since: float, *, page: int = 10_000) -> dict[str, list[float]]:
        """The predictions of the answered snapshots written at or after ``since`` (UNIX seconds), by version:
        what the canary analysis compares. Reads the stream from that time on, ``page`` entries at a time."""
        found: dict[str, list[float]] = {}
        start = f"{max(0, int(since * 1000))}-0"
        while True:
            with translated("reading snapshots"):
                entries: Any = self.redis.xrange(stream_of(model), min=start, count=page)
            for entry_id, fields in entries:
                try:
                    snapshot = Snapshot.from_fields(entry_id, fields)
                except (KeyError, ValueError, TypeError):
                    continue
                if snapshot.ok:
                    found.setdefault(snapshot.version, []).append(snapshot.prediction)
            if len(entries) < page:
                return found
            start = "(" + str(entries[-1][0])

    def read_new(self, model: str, count: int = 10_000) -> list[Snapshot]:
        """Snapshots after the drift checkpoint: what the drift flow has not consumed yet."""
        return self.read(model, self.checkpoint(model), count)

    def advance(self, model: str, entry_id: str) -> str:
        """Mark everything up to ``entry_id`` as consumed; a checkpoint never moves back. Returns the checkpoint."""
        with translated("advancing the drift checkpoint"):
            return str(self._advance(keys=[checkpoint_key(model)], args=[entry_id]))

    def trim_below(self, model: str, entry_id: str) -> int:
        """Delete the entries below ``entry_id`` and below the checkpoint; without a checkpoint none. The count."""
        with translated("trimming snapshots"):
            return int(self._trim(keys=[stream_of(model), checkpoint_key(model)], args=[entry_id]))

    def trim_older_than(self, model: str, max_age_s: float, now: float) -> int:
        """Delete the snapshots written more than ``max_age_s`` before ``now``, consumed or not. The count."""
        bound = f"{max(0, int((now - max_age_s) * 1000))}-0"
        with translated("trimming old snapshots"):
            return int(self.redis.xtrim(stream_of(model), minid=bound, approximate=False))

    def length(self, model: str) -> int:
        with translated("counting snapshots"):
            return int(self.redis.xlen(stream_of(model)))
