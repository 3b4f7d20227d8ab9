"""The trace store port: where traces are written in batches, read back, and pruned.

``TraceStore`` is implemented by ``SqlTraceStore`` (``sql_store``). Every method raises
``StoreUnavailable`` when the store cannot be reached; ``InvalidInput`` for a query it cannot run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple, Protocol

from examlops.core.errors import InvalidInput
from examlops.tracing.record import Outcome, TraceRecord

MAX_PAGE = 1000
"""The most traces one read returns."""


@dataclass(frozen=True, slots=True)
class TraceQuery:
    """Which traces to read: every given filter must hold; newest first, ``limit`` of them after ``offset``.

    ``since`` is a UNIX time (traces that arrived at or after it); names match exactly (callers give
    the catalog's spelling of a model).
    """

    identity: str | None = None
    task: str | None = None
    model: str | None = None
    outcome: Outcome | None = None
    channel: str | None = None
    since: float | None = None
    limit: int = 50
    offset: int = 0


@dataclass(frozen=True, slots=True)
class Pruned:
    """What one retention pass did: rows deleted, rows whose stored input and output were cleared."""

    deleted: int
    cleared: int


class CallOutcome(NamedTuple):
    """What a canary analysis reads of one trace: the version that served it, its outcome, error code, time
    used (ms) and arrival (UNIX seconds)."""

    version: str | None
    outcome: str
    error_code: str
    used_ms: float
    at: float


class TraceStore(Protocol):
    def add(self, records: Sequence[TraceRecord]) -> int:
        """Write the records in one transaction, one row per trace id: a record whose id is stored already
        only fills the fields the stored one left empty (a reclaimed job served twice stays its first
        trace), unless it is a verdict (``TraceRecord.verdict``), whose outcome, error code and status
        replace the stored ones, whichever of the two arrived first. Returns how many ids were new."""

    def get(self, trace_id: str) -> TraceRecord | None: ...

    def find(self, query: TraceQuery) -> list[TraceRecord]: ...

    def count(self, query: TraceQuery) -> int:
        """How many traces match ``query``'s filters (its limit and offset aside)."""

    def prune(self, now: float, *, payload_max_age_s: float, row_max_age_s: float) -> Pruned:
        """Delete rows older than ``row_max_age_s``, clear input and output of those older than
        ``payload_max_age_s``."""

    def close(self) -> None:
        """Release what the store holds of its own (a writer process); the SQL engine is its owner's."""


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_since(text: str, now: float) -> float:
    """A ``since`` filter as a UNIX time: a duration back from ``now`` (``90s``, ``15m``, ``2h``, ``7d``), an
    ISO 8601 time (UTC when it names no zone) or UNIX seconds; ``InvalidInput`` for anything else."""
    value = text.strip()
    if value[-1:] in _UNITS:
        try:
            return now - float(value[:-1]) * _UNITS[value[-1]]
        except ValueError:
            pass
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError as exc:
        raise InvalidInput(
            f"since: {value[:40]!r} is not a duration (15m, 2h, 7d), an ISO time or UNIX seconds", field="since"
        ) from exc
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
