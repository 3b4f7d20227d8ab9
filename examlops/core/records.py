"""The record of one served bus job, its entry on the records stream, and the port that writes records.

``ServedInference`` is the one shape of a served job, from the bridge that answered it to the sink that
writes its drift snapshot and audit event. The bridge writes it to the records stream in the same atomic
step as the reply (``bus.scripts.REPLY_SCRIPT``); a recorder reads it back (``read_record``) and hands
batches to a ``RecordSink``. The embedding itself never travels: the bridge computes its statistics.

A record entry's fields: ``r``, the JSON array ``[address, model, caller, node_count, served_at, norm,
mean, std]`` (a non-finite float as its repr string), then the reply's own fields (``job_id``, ``status``,
``body``), sent once for both streams. ``read_record`` raises ``ValueError`` for an entry not so shaped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

RECORDS_STREAM = "examlops:records"
"""Served records not yet written; the bridges add to it, the recorders drain it."""
RECORDERS_GROUP = "recorders"
RECORDS_DROPPED = "examlops:records:dropped"
"""A counter: records the bridges did not add because the stream held its bound."""


@dataclass(frozen=True, slots=True)
class ServedInference:
    """A job that serving answered and whose reply was written for the first time.

    ``reply`` is the reply body as the caller got it; ``norm``, ``mean`` and ``std`` (population) are the
    embedding's statistics (``embedding_stats``); ``entry_id`` is the record's id on the records stream
    ('' before it is written there).
    """

    job_id: str
    address: str
    model: str
    caller: str
    node_count: int
    reply: Mapping[str, Any]
    status: int
    served_at: float
    norm: float = 0.0
    mean: float = 0.0
    std: float = 0.0
    entry_id: str = ""

    def packed(self) -> str:
        """The record's ``r`` field (the reply's fields travel beside it)."""
        values = (self.norm, self.mean, self.std)
        stats = values if all(map(math.isfinite, values)) else tuple(_float_text(v) for v in values)
        row = [self.address, self.model, self.caller, self.node_count, self.served_at, *stats]
        return orjson.dumps(row).decode()


def embedding_stats(embedding: Sequence[float]) -> tuple[float, float, float]:
    """(L2 norm, mean, population standard deviation); zeros for an empty embedding.

    In ``math``'s C loops. The variance is first taken as E[x^2] - mean^2 from the norm; where the mean is
    so large against the spread that this loses digits (variance below 1e-6 mean^2), it is taken again from
    the deviations (``math.dist``).
    """
    n = len(embedding)
    if n == 0:
        return 0.0, 0.0, 0.0
    mean = float(sum(embedding)) / n  # a plain float also for numpy floats, whose repr is not a number
    norm = math.hypot(*embedding)
    variance = norm * norm / n - mean * mean
    if variance > 1e-6 * mean * mean:
        return norm, mean, math.sqrt(variance)
    return norm, mean, math.dist(embedding, [mean] * n) / math.sqrt(n)


def read_record(entry_id: str, fields: Mapping[str, str]) -> ServedInference:
    """The record of one records-stream entry; ``ValueError`` for an entry that is not one."""
    try:
        row = orjson.loads(fields["r"])
        body = orjson.loads(fields["body"])
        job_id, status = fields["job_id"], int(fields["status"])
    except (KeyError, orjson.JSONDecodeError) as exc:
        raise ValueError(f"record {entry_id} lacks a readable field ({exc})") from exc
    if type(row) is not list or len(row) != 8 or not isinstance(body, dict):
        raise ValueError(f"record {entry_id} is not a record entry")
    address, model, caller, node_count, served_at, norm, mean, std = row
    if not all(type(v) is str for v in (address, model, caller)) or type(node_count) is not int:
        raise ValueError(f"record {entry_id}: a text field is not a string or the node count not an integer")
    served_at, norm, mean, std = map(stored_float, (served_at, norm, mean, std))
    return ServedInference(
        job_id, address, model, caller, node_count, body, status, served_at, norm, mean, std, entry_id
    )


class RecordSink(Protocol):
    """Writes records (their drift snapshots, audit events, failure counts).

    ``write`` is all or nothing per record and idempotent per ``entry_id``: a record written before (by
    this sink or another, whose acknowledgement was lost) is not written again. It raises
    ``StoreUnavailable`` when its store is down (nothing or all of a record was written; retry the batch).
    """

    def write(self, records: Sequence[ServedInference]) -> None: ...

    def idle(self) -> None:
        """Called when there was nothing to write for a while (due checkpoints)."""

    def close(self) -> None:
        """Called once, after the last write."""


def _float_text(value: float) -> float | str:
    return value if math.isfinite(value) else repr(value)


def stored_float(value: Any) -> float:
    """A stored float: a JSON number, or the repr of infinity or NaN; ``ValueError`` for anything else."""
    if type(value) in (int, float):
        return float(value)
    if type(value) is str and value in ("inf", "-inf", "nan"):
        return float(value)
    raise ValueError(f"not a number: {value!r}")
