"""What an offline job is: its states, its row, one instance and one line of its results.

A job is a task answered for many instances under one long budget (minutes to hours), run in the gaps
around interactive calls. Its instances are fed ``batch_size`` at a time; ``done_batches`` counts the
batches whose result lines are in the results file up to ``results_bytes`` (the offset recorded with
them): past that offset the file holds nothing that counts. States move forward only:

    queued -> running -> done | failed | expired | cancelled
    queued -> cancelled | expired

``expires_at`` is the end of the budget (UNIX time); a job still unfinished then is ``expired``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self not in (JobState.QUEUED, JobState.RUNNING)


LIVE_STATES = (JobState.QUEUED, JobState.RUNNING)
MIN_BUDGET_MS = 1000.0
"""A job's budget is at least a second: anything shorter is an interactive call."""


@dataclass(frozen=True, slots=True)
class Job:
    """One job as stored. ``identity`` submitted it; ``model``/``alias`` are what the task map said then."""

    id: str
    identity: str
    task: str
    model: str
    alias: str
    budget_ms: float
    created_at: float
    expires_at: float
    state: JobState
    total: int
    batch_size: int
    instances_path: str
    """The JSONL file of the instances, absolute, under the state folder."""
    trace_id: str
    done_batches: int = 0
    answered: int = 0
    """Instances with a result line (an answer or that instance's own error)."""
    errors: int = 0
    """Of those, instances answered with an error (a bad payload, a failed predict)."""
    results_bytes: int = 0
    error: str = ""
    """Why the job failed, expired or was cancelled; empty otherwise."""
    cancel_requested: bool = False
    finished_at: float | None = None

    @property
    def batches(self) -> int:
        return -(-self.total // self.batch_size) if self.total else 0


@dataclass(frozen=True, slots=True)
class Instance:
    """One instance of a job: what one interactive call's body would carry."""

    embedding: tuple[float, ...]
    node_count: int
    user_id: str | None = None


def result_line(
    index: int, *, answer: dict[str, Any] | None = None, error: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One line of the results file: ``{"index": i, "prediction": ..., "model": ..., ...}`` for an answered
    instance, ``{"index": i, "error": {"code": ..., "message": ...}}`` for one that failed on its own."""
    return {"index": index, **(answer or {})} if error is None else {"index": index, "error": error}


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_MS = {"ms": 1.0, "s": 1000.0, "m": 60_000.0, "min": 60_000.0, "h": 3_600_000.0, "d": 86_400_000.0}


def parse_duration_ms(text: str) -> float:
    """``"2h"``, ``"90m"``, ``"45s"``, ``"1.5h"``, ``"500ms"`` (no unit: seconds) in milliseconds;
    ``ValueError`` naming what it takes."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text[:32]!r} is not a duration: a number with ms, s, m, h or d (e.g. 2h, 90m)")
    return float(match.group(1)) * _UNIT_MS[(match.group(2) or "s").lower()]
