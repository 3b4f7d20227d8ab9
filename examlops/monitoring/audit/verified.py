"""The last result of `exa audit verify`, kept in Redis so that a reader (the dashboard) never walks the chain.

``record_verify(client, secret, report, by)`` stores one small signed JSON value under ``AUDIT_VERIFIED``
(``core.keys``): when the check ran, who ran it (`exa audit verify`, the retention flow), whether the chain
was intact, how many events and checkpoints it covered and what it found wrong. Each verify replaces the last.
``last_verify(client, secret)`` reads it back: None when no verify stored one; a value whose HMAC does not
match the site's secret comes back as a failed check saying so, never as "intact". Redis errors are
``StoreUnavailable``. ``one_verify(client)`` is a lease (``AUDIT_VERIFYING``, expiring after ``lease_s``)
that lets one scheduled verify run at a time: a retention run that finds another verify under way skips its
own. Why: a full verify of a 30,000-event trail took 0.99 s of wall time (``bench/RESULTS.md``, Issue 22),
too much for serving to run while a page is open.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any

import redis

from examlops.adapters.redis import translated
from examlops.core.keys import AUDIT_VERIFIED, AUDIT_VERIFYING
from examlops.monitoring.audit.verify import VerifyReport

UNREADABLE_BY = "?"
"""``VerifyRecord.by`` of a stored value that could not be read (then ``at`` is 0 and ``ok`` False)."""


@dataclass(frozen=True, slots=True)
class VerifyRecord:
    at: float
    """UNIX time the verify finished."""
    by: str
    ok: bool
    events: int
    last_seq: int
    checkpoints: int
    problems: tuple[str, ...]
    """The first broken link, then any other finding (an alias move the trail does not account for)."""
    notes: tuple[str, ...] = ()
    """What the check could not cover (``aliases not checked: <why>``): not a failure, never dropped."""


NOT_RECHECKED = "(not re-checked since: the registry could not be read)"


def carried_findings(previous: VerifyRecord | None) -> tuple[str, ...]:
    """The alias findings of ``previous`` (not its chain break: each walk judges the chain itself), to store
    again while the registry cannot be read, so a run that could not look never clears what one that could
    found."""
    if previous is None or previous.ok or previous.by == UNREADABLE_BY:
        return ()
    kept = (p for p in previous.problems if not p.startswith("seq "))
    return tuple(p if p.endswith(NOT_RECHECKED) else f"{p} {NOT_RECHECKED}" for p in kept)


def _mac(secret: bytes, body: str) -> str:
    return hmac.new(secret, b"audit-verified\n" + body.encode(), hashlib.sha256).hexdigest()


def record_verify(
    client: redis.Redis,
    secret: bytes,
    report: VerifyReport,
    by: str,
    *,
    findings: Sequence[str] = (),
    notes: Sequence[str] = (),
    now: float | None = None,
) -> VerifyRecord:
    """Store ``report`` (and ``findings``, which make it a failure too, and ``notes``) as the last verify result."""
    broken = report.broken
    problems = ((f"seq {broken.seq} ({broken.kind}): {broken.message}",) if broken else ()) + tuple(findings)
    record = VerifyRecord(
        time.time() if now is None else now, by, not problems, report.events, report.last_seq,
        report.checkpoints, problems, tuple(notes),
    )  # fmt: skip
    body = json.dumps(asdict(record), sort_keys=True)
    with translated("storing the audit verify result"):
        client.set(AUDIT_VERIFIED, json.dumps({"body": body, "mac": _mac(secret, body)}))
    return record


def last_verify(client: redis.Redis, secret: bytes) -> VerifyRecord | None:
    """The stored result, None without one; one this site's secret did not sign is a failure saying so."""
    with translated("reading the audit verify result"):
        raw = client.get(AUDIT_VERIFIED)
    if raw is None:
        return None
    try:
        stored: dict[str, Any] = json.loads(raw)
        body = str(stored["body"])
        genuine = hmac.compare_digest(_mac(secret, body), str(stored["mac"]))
        fields = json.loads(body)
        record = VerifyRecord(
            float(fields["at"]), str(fields["by"]), bool(fields["ok"]), int(fields["events"]),
            int(fields["last_seq"]), int(fields["checkpoints"]), tuple(str(p) for p in fields["problems"]),
            tuple(str(n) for n in fields.get("notes", ())),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError):
        return VerifyRecord(0.0, UNREADABLE_BY, False, 0, 0, 0, ("the stored verify result cannot be read",))
    if not genuine:
        return replace(record, ok=False, problems=("the stored verify result is not signed with this site's secret",))
    return record


RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


@contextmanager
def one_verify(client: redis.Redis, lease_s: float = 600.0) -> Iterator[bool]:
    """True while this caller holds the verify lease, False when another verify holds it (then run none). The
    lease expires after ``lease_s`` should its holder die; it is released on exit only by its holder."""
    owner = secrets.token_hex(8)
    with translated("taking the audit verify lease"):
        held = bool(client.set(AUDIT_VERIFYING, owner, nx=True, px=int(lease_s * 1000)))
    try:
        yield held
    finally:
        if held:
            with translated("releasing the audit verify lease"):
                client.eval(RELEASE, 1, AUDIT_VERIFYING, owner)
