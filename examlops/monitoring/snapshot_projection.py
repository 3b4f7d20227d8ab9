"""A ``SnapshotReader`` that fetches from Redis only the fields a drift report reads.

Contract: ``ProjectedSnapshotReader`` wraps ``monitoring.snapshots.SnapshotStream``; checkpoint, advance
and trim are the stream's own, and ``read`` runs one Lua script per page that returns, per entry, the
id, version, error code, prediction and embedding statistics (one field per snapshot stored packed).
Projecting in Redis costs far less than parsing whole entries in redis-py (bench/RESULTS.md).

Failure mode: entries that are not snapshots read as not ``ok`` (the report skips them); Redis that
cannot be reached is ``StoreUnavailable``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from examlops.monitoring.drift_report import PAGE

_PROJECT_SCRIPT = """
-- KEYS: snapshot stream. ARGV: start id (inclusive, or '(' id), count. One string per entry:
-- 'id version code prediction norm mean std ts' with '-' for an empty code, or, for a snapshot stored as
-- one field, 'id' newline and that field (the JSON array). Only what the report reads leaves Redis.
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
