"""The trace of one call: ``TraceRecord``, its outcome, and the trace id every reply carries.

One record per call, HTTP or bus, whatever became of it: ``answered`` (a prediction went back),
``refused`` (the platform declined to run it: bad input, unknown model, deadline passed, not ready), or
``failed`` (it was accepted and went wrong: the model raised or timed out, a dependency was down). The
outcome is a property of the error (``outcome_of``), never of an HTTP status.

Trace ids are 32 lower-case hex digits. A bus job's id is derived from its verified job id
(``trace_id_for_job``), so serving and the bridge name the same call the same way and a job served twice
after a reclaim still has one trace; every other call gets a fresh one (``new_trace_id``): the UNIX time in
milliseconds (12 hex digits, as a UUIDv7 begins) then 80 random bits, so ids made one after another sort
in time and a batch of new traces lands at the end of the store's index rather than on as many pages as
it has rows.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass, fields
from typing import Any, Literal

from examlops.core.errors import DependencyUnavailable, ExamlopsError, InferenceFailed

Channel = Literal["http", "bus"]
Outcome = Literal["answered", "refused", "failed"]
OUTCOMES: tuple[Outcome, ...] = ("answered", "refused", "failed")
TRACE_HEADER = "X-Examlops-Trace"
"""The reply header that carries the trace id; the bridge also sends it to serving with the bus job's id."""
CHANNEL_HEADER = "X-Examlops-Channel"
"""Sent by the bridge to serving (`bus`): the call came over the bus, so its trace says so."""
IDENTITY_HEADER = "X-Examlops-Identity"
"""Sent by the bridge to serving: the identity whose signed bus job this call serves (trusted from a caller
holding the ``relay`` permission only)."""

_TRACE_ID = re.compile(r"^[0-9a-f]{32}$")


def new_trace_id() -> str:
    """A fresh trace id: milliseconds since the epoch (12 hex digits) and 80 random bits (20)."""
    return f"{time.time_ns() // 1_000_000 & 0xFFFF_FFFF_FFFF:012x}{os.urandom(10).hex()}"


def trace_id_for_job(job_id: str) -> str:
    """The trace id of a verified bus job: the same for every delivery of the job, in every process."""
    return hashlib.sha256(b"examlops.trace.v1\x00" + job_id.encode()).hexdigest()[:32]


def valid_trace_id(value: str | None) -> bool:
    """Whether ``value`` is a trace id as this module makes them (a header from elsewhere is checked first)."""
    return value is not None and _TRACE_ID.fullmatch(value) is not None


def outcome_of(error: BaseException | str | None) -> Outcome:
    """``answered`` without an error; ``failed`` for a model failure or a dependency that was down (or an
    error that is not ours, or a code naming one of those); ``refused`` for everything else."""
    if error is None:
        return "answered"
    if isinstance(error, str):
        return "failed" if error in _FAILED_CODES or error.startswith("http_5") else "refused"
    if isinstance(error, InferenceFailed | DependencyUnavailable) or not isinstance(error, ExamlopsError):
        return "failed"
    return "refused"


_FAILED_CODES = frozenset(
    (
        "inference_failed",
        "inference_timeout",
        "dependency_unavailable",
        "registry_unavailable",
        "store_unavailable",
        "pipeline_unavailable",
        "worker_lost",
        "undeliverable",
        "examlops_error",
        "internal_error",
    )
)


@dataclass(slots=True)
class TraceRecord:
    """One call, as the trace store keeps it. Nothing changes a record once it is built; it is not frozen
    because one is built on every call's request path (and again in the trace writer), where a frozen
    dataclass's ``__init__`` of these 24 fields costs several times a plain one's (bench/RESULTS.md).

    ``at`` is the UNIX time the call arrived; ``used_ms`` how long it took until its reply. ``identity``,
    ``budget_remaining_ms`` is what was left of the call's budget (or deadline) when it ended, negative
    when it ran over; None without either.
    ``task``, ``adapter`` and ``budget_ms`` are empty until the platform knows them (identities, tasks and
    budgets fill them). ``batch_id``/``batch_size`` name the predict batch the call joined (one predict
    call of one loaded version), ``queue_wait_ms`` the time from arrival to its micro-batch being handled,
    ``predict_ms`` the predict call's own time: all empty when the call never got that far. ``error_code``
    is '' for an answered call. ``input`` and ``output`` are what the site's payload policy kept ('' for
    nothing); ``status`` is the HTTP status of the reply (0 when none was given, as on the bus before
    serving answered).

    ``verdict`` is not stored: it marks the bridge's record of a bus call whose caller got something else
    than serving's reply said (a late answer refused, a hop that failed after serving answered). The store
    keeps a verdict's outcome, error code and status over any other record of the same call, whichever
    arrives first.
    """

    trace_id: str
    at: float
    channel: Channel
    outcome: Outcome
    error_code: str = ""
    model: str | None = None
    alias: str | None = None
    version: str | None = None
    adapter: str | None = None
    identity: str | None = None
    task: str | None = None
    budget_ms: float | None = None
    budget_remaining_ms: float | None = None
    used_ms: float = 0.0
    node: str = ""
    batch_id: str | None = None
    batch_size: int | None = None
    queue_wait_ms: float | None = None
    predict_ms: float | None = None
    status: int = 0
    job_id: str | None = None
    input: str = ""
    output: str = ""
    verdict: bool = False


_STORED = tuple(f.name for f in fields(TraceRecord) if f.name != "verdict")


def trace_fields(record: TraceRecord) -> dict[str, Any]:
    """The stored fields of ``record`` (all but ``verdict``), as the store, `exa trace` and the API show them:
    a shallow copy, every field being a plain value (``dataclasses.asdict`` deep-copies: bench/RESULTS.md)."""
    return {name: getattr(record, name) for name in _STORED}
