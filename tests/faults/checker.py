"""The history checker: after a run, what Redis holds is compared with the client's ``History``.

``check(history, redis_url, settings)`` reads every reply stream, the records
stream, the snapshot streams and the audit chain, and returns ``Figures``.
``Figures.violations()`` lists every broken promise; a scenario asserts it is
empty (or, for a known bug, marks the test xfail). What it proves:

- no bus job id was answered twice (two reply entries for one job id, on any
  client's reply stream, not counting the copies a retry got: a bridge resends
  a job id's one reply, marked ``resent``, to a retry of an answered job id);
  every resent reply is the same answer as the first (``resent_differs``);
- no job was lost: every job the client certainly submitted (an ``ok``
  operation, or an ``unknown`` one whose job reached Redis) has a reply, an
  answer or an error, once the bridges have settled. Apart, as a figure of its
  own (``lost_in_aof_window``, not a violation): answered jobs whose reply is
  gone that the client got within ``AOF_WINDOW_S`` before a
  ``fault:redis_sigkill`` mark (up to its heal): the acknowledged writes the
  README says a killed Redis with ``appendfsync everysec`` can lose;
- every reply that serving's answer (or a recorded error) produced has exactly
  one drift snapshot and exactly one ``inference.served`` audit event; replies
  that are never recorded (``NOT_RECORDED``: refused, unauthenticated,
  forbidden, past the deadline, no such model, undeliverable) have none;
- no ``unknown`` operation was applied twice: its job id answered twice, or
  its snapshot or its ``inference.served`` event written twice (the case a
  client that resends a job id after a timeout fears, counted on its own);
- the audit chain verifies (``examlops.monitoring.audit.verify`` against the
  signed checkpoints in SQL).

``settle`` first waits (bounded) until the recorders drained the records
stream, so the figures are not taken while a record is still on its way.
Reply streams live 600 s and hold 10 000 entries: a run must stay under both.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis

from examlops.bootstrap import sql_engine
from examlops.bus import wire
from examlops.core.records import RECORDERS_GROUP, RECORDS_DROPPED, RECORDS_STREAM
from examlops.core.settings import Settings
from examlops.monitoring.audit import INFERENCE_SERVED, STREAM, SqlCheckpointStore, verify
from examlops.monitoring.snapshots import FIELDS, MODELS, stream_of
from tests.faults.history import History, Outcome

NOT_RECORDED = frozenset(
    {"refused", "unauthenticated", "forbidden", "deadline_exceeded", "model_not_found", "undeliverable"}
)
"""Reply codes that the bus never records (bus/README.md, "What a job gets")."""
_JOB_ID_AT = FIELDS.index("job_id")
AOF_WINDOW_S = 2.0
"""How far back a Redis SIGKILL can reach: with ``appendfsync everysec`` Redis may hold the AOF write back up
to ~2 s behind a slow fsync while still replying (README, "A single Redis with AOF every second")."""


@dataclass(frozen=True)
class Figures:
    """A run's figures. A list of job ids, or a count, that is None was not measured (HTTP load has no job
    ids to check for duplicates or records: ``http_load.figures``); a table shows it as n/a, never 0."""

    invoked: int
    ok: int
    failed: int
    unknown: int
    answered_with_error: int
    """Ok operations whose reply was an error body (pipeline unreachable, deadline exceeded...)."""
    lost: list[str]
    answered_twice: list[str] | None
    unknown_applied_twice: list[str] | None
    unrecorded: list[str] | None
    recorded_twice: list[str] | None
    recorded_unanswered: list[str] | None
    """Snapshots or audit events for a job id with no recorded reply: recorded although never answered."""
    audit_ok: bool | None
    audit_events: int | None
    audit_problem: str
    records_dropped: int | None
    records_left: int | None
    resent: int | None = None
    """Reply entries a bridge resent to a retry of an answered job id (the same answer again, not a second)."""
    resent_differs: list[str] | None = None
    """Job ids with a resent reply that is not the first reply's answer."""
    lost_in_aof_window: list[str] | None = None
    """Answered jobs whose reply is gone, answered within ``AOF_WINDOW_S`` before a Redis SIGKILL: the loss the
    README bounds, counted apart from ``lost`` (which stays a violation)."""
    max_latency_s: float = 0.0
    """The longest an ok operation waited for its reply (a reclaimed job waits out the reclaim idle time)."""
    recover_s: dict[str, float] = field(default_factory=dict)
    """Per heal mark: seconds from the mark to the first answer without an error completed after it."""

    @property
    def requests_failed(self) -> int:
        return self.failed + self.unknown + self.answered_with_error

    def violations(self) -> list[str]:
        found = []
        for name in IDS:
            ids: list[str] | None = getattr(self, name)
            if ids:
                found.append(f"{name}: {len(ids)} ({', '.join(sorted(ids)[:5])})")
        if self.audit_ok is False:
            found.append(f"audit chain broken: {self.audit_problem}")
        if self.records_left:
            found.append(f"records never drained: {self.records_left}")
        return found

    def summary(self) -> dict[str, Any]:
        """Every figure the checker computed, as one JSON object; None where it was not measured."""
        counted = {name: None if getattr(self, name) is None else len(getattr(self, name)) for name in IDS}
        return {
            "invoked": self.invoked,
            "ok": self.ok,
            "failed": self.failed,
            "unknown": self.unknown,
            "answered_with_error": self.answered_with_error,
            **counted,
            "duplicated": counted["answered_twice"],  # the table's name for it
            "resent": self.resent,
            "lost_in_aof_window": None if self.lost_in_aof_window is None else len(self.lost_in_aof_window),
            "requests_failed": self.requests_failed,
            "audit_events": self.audit_events,
            "audit_ok": self.audit_ok,
            "audit_problem": self.audit_problem,
            "records_dropped": self.records_dropped,
            "records_left": self.records_left,
            "max_latency_s": round(self.max_latency_s, 2),
            "recover_s": {k: round(v, 2) for k, v in self.recover_s.items()},
        }


IDS = (
    "lost",
    "answered_twice",
    "unknown_applied_twice",
    "resent_differs",
    "unrecorded",
    "recorded_twice",
    "recorded_unanswered",
)
"""The figures that list job ids: each one a violation when not empty."""


def _client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=30)


def settle(redis_url: str, timeout_s: float = 60.0) -> int:
    """Wait until the records stream is drained and settled; the records still left (0 when it is)."""
    deadline = time.monotonic() + timeout_s
    with _client(redis_url) as client:
        while True:
            left = int(client.xlen(RECORDS_STREAM))
            pending = 0
            if left:
                try:
                    pending = int(client.xpending(RECORDS_STREAM, RECORDERS_GROUP)["pending"])
                except redis.ResponseError:
                    pending = left
            if left == 0 or time.monotonic() > deadline:
                return max(left, pending)
            time.sleep(0.2)


def _scan(client: redis.Redis, pattern: str) -> Iterable[str]:
    yield from client.scan_iter(match=pattern, count=1000)


def _xrange(client: redis.Redis, key: str) -> list[tuple[str, dict[str, str]]]:
    """A whole stream (decoded strings: ``_client``)."""
    entries: Any = client.xrange(key)
    return list(entries)


def replies(client: redis.Redis) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    """Every reply on every client's reply stream, (first replies, resent ones): job id -> the reply bodies."""
    found: dict[str, list[dict[str, Any]]] = {}
    resent: dict[str, list[dict[str, Any]]] = {}
    for stream in _scan(client, wire.REPLIES_PREFIX + "*"):
        for _id, fields in _xrange(client, stream):
            body = orjson.loads(fields.get("body", "{}"))
            into = resent if fields.get("resent") else found
            into.setdefault(fields.get("job_id", ""), []).append(body if isinstance(body, dict) else {})
    return found, resent


def snapshot_job_ids(client: redis.Redis) -> Counter[str]:
    counts: Counter[str] = Counter()
    models: Any = client.smembers(MODELS)
    for model in models:
        for _id, fields in _xrange(client, stream_of(str(model))):
            counts[str(orjson.loads(fields["s"])[_JOB_ID_AT])] += 1
    return counts


def served_event_job_ids(client: redis.Redis) -> Counter[str]:
    counts: Counter[str] = Counter()
    for _id, fields in _xrange(client, STREAM):
        if fields.get("type") == INFERENCE_SERVED:
            counts[str(orjson.loads(fields["data"]).get("job_id"))] += 1
    return counts


def recorded(body: dict[str, Any]) -> bool:
    return body.get("error") is None or body.get("code") not in NOT_RECORDED


def recovery(history: History) -> dict[str, float]:
    found = {}
    for name, at in history.marks:
        if not name.startswith("heal"):
            continue
        after = [op.completed for op in history.operations if op.answered_ok and op.completed and op.completed >= at]
        if after:
            found[name] = min(after) - at
    return found


def aof_windows(history: History) -> list[tuple[float, float]]:
    """Per ``fault:redis_sigkill`` mark: from ``AOF_WINDOW_S`` before it to the next heal mark (a reply read
    between the mark and the kill itself was in the window too; none is read while Redis is down)."""
    windows = []
    for name, at in history.marks:
        if name.startswith("fault:redis_sigkill"):
            heals = [t for other, t in history.marks if other.startswith("heal:") and t >= at]
            windows.append((at - AOF_WINDOW_S, min(heals, default=at)))
    return windows


def check(history: History, redis_url: str, settings: Settings, *, settle_s: float = 60.0) -> Figures:
    """The figures of a finished run; call it once every operation is closed and the bridges still run."""
    still_open = history.open()
    if still_open:
        raise ValueError(f"{len(still_open)} operations were never closed")
    left = settle(redis_url, settle_s)
    with _client(redis_url) as client:
        answered, resent = replies(client)
        snapshots = snapshot_job_ids(client)
        events = served_event_job_ids(client)
        dropped = int(client.get(RECORDS_DROPPED) or 0)
        engine = sql_engine(settings)
        try:
            report = verify(client, settings.secret.get_secret_value().encode(), SqlCheckpointStore(engine))
        finally:
            engine.dispose()
    ops = history.operations
    submitted = {op.key for op in ops if op.outcome is Outcome.OK or op.submitted}
    unknown = {op.key for op in ops if op.outcome is Outcome.UNKNOWN}
    windows = aof_windows(history)
    in_window = {
        op.key
        for op in ops
        if op.outcome is Outcome.OK
        and op.completed is not None
        and op.key not in answered
        and any(start <= op.completed <= end for start, end in windows)
    }
    twice = sorted(job for job, bodies in answered.items() if len(bodies) > 1)
    differs = sorted(job for job, bodies in resent.items() if any(b not in answered.get(job, []) for b in bodies))
    should_record = {job for job, bodies in answered.items() if any(recorded(b) for b in bodies)}
    unrecorded = sorted(job for job in should_record if snapshots[job] == 0 or events[job] == 0)
    recorded_twice = sorted(job for job in should_record if snapshots[job] > 1 or events[job] > 1)
    stray = sorted((set(snapshots) | set(events)) - should_record)
    applied_twice = set(twice) | {job for job in set(snapshots) | set(events) if snapshots[job] > 1 or events[job] > 1}
    return Figures(
        invoked=len(ops),
        ok=history.count(Outcome.OK),
        failed=history.count(Outcome.FAILED),
        unknown=history.count(Outcome.UNKNOWN),
        answered_with_error=sum(1 for op in ops if op.outcome is Outcome.OK and not op.answered_ok),
        lost=sorted(job for job in submitted - in_window if job not in answered),
        lost_in_aof_window=sorted(in_window),
        answered_twice=twice,
        unknown_applied_twice=sorted(applied_twice & unknown),
        unrecorded=unrecorded,
        recorded_twice=recorded_twice,
        recorded_unanswered=stray,
        audit_ok=report.ok,
        audit_events=report.events,
        audit_problem="" if report.broken is None else f"{report.broken.kind} at {report.broken.seq}",
        records_dropped=dropped,
        records_left=left,
        max_latency_s=max(
            (op.completed - op.invoked for op in ops if op.outcome is Outcome.OK and op.completed is not None),
            default=0.0,
        ),
        recover_s=recovery(history),
        resent=sum(len(bodies) for bodies in resent.values()),
        resent_differs=differs,
    )
