"""The wire format of the bus: stream names and signed jobs (reply entries: ``replies``).

Pure: no redis, no I/O. ``store`` runs what is defined here against Redis.

Streams and keys::

    examlops:bus:jobs:{uuid}          jobs for one model, by its catalog ``seanerbus_uuid``; group ``bridges``
    examlops:bus:replies:{client_id}  one per client; capped (MAXLEN ~) and expiring, so abandoned ones vanish
    examlops:bus:done:{job_id}        set once, when a job's reply is written: exactly one reply per job id;
                                      holds the finish's token, the request's digest and where its reply is
                                      (``reply_location``)
    examlops:bus:dead                 dead letters: unverifiable, stale and over-delivered jobs, with the reason
    examlops:bus:handlers             hash uuid -> last heartbeat of a bridge serving it
    examlops:bus:addresses            set of the uuids with a job stream: bridges find orphans without a SCAN

A producer puts a job on its model's stream and adds the address to
``examlops:bus:addresses`` in one step (``SUBMIT_SCRIPT``; a bridge also adds
every job stream it finds with one SCAN when it starts).

A job entry's fields: ``v`` (format version), ``job_id``, ``reply_to`` (a reply
stream key), ``key`` (the key id of the identity that sends it), ``deadline``
(absolute UNIX seconds, also the signature's expiry), ``payload`` (canonical
JSON), optionally ``submitted`` (the client's UNIX time at submission) and
``budget_ms`` (the job's latency budget, seed 001), and ``sig``: hex
HMAC-SHA256 with that identity's bus key over the canonical JSON array of the
format tag, job id, address, reply stream, key id, deadline and payload, then
``submitted`` and ``budget_ms`` (``""`` for one not sent) when either is sent,
exactly as they travel: a budget can be neither stripped nor loosened. The
job's deadline is the earlier of ``deadline`` and ``submitted`` + ``budget_ms``. The address is not a field: it
is the stream the job was read from, so a job copied onto another address's
stream fails its signature. The bridge looks the key id up (``ports.BusKeys``)
before it believes anything else in the job.

A reply entry (``replies``) is signed with the same identity's bus key, under its own format tag.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import orjson

from examlops.bus import budget
from examlops.bus.signing import matches, sign
from examlops.core import keys
from examlops.core.errors import DeadlineExceeded, ExamlopsError, InvalidInput
from examlops.core.jsoncodec import canonical

FORMAT = "2"
PREFIX = "examlops:bus"
GROUP = "bridges"
DEAD_STREAM = f"{PREFIX}:dead"
HANDLERS_KEY = keys.BUS_HANDLERS
ADDRESSES_KEY = f"{PREFIX}:addresses"
JOBS_PREFIX = f"{PREFIX}:jobs:"
REPLIES_PREFIX = f"{PREFIX}:replies:"

MAX_DELIVERIES = 3
"""A job delivered more often than this is dead-lettered with an error reply."""
MAX_JOB_TTL_S = 3600.0
"""Jobs whose deadline lies further ahead are refused, so that a done key can outlive every valid job."""
DONE_MARGIN_S = 600.0
"""A done key outlives its job's deadline by this much (reclaims, clock skew); past it, a copy of the job
is refused as expired, never served."""
DONE_TTL_S = int(MAX_JOB_TTL_S + DONE_MARGIN_S)
REPLY_STREAM_TTL_S = 600
"""The default of ``settings.bus.reply_ttl_s``."""
REPLY_STREAM_MAXLEN = 10_000
JOB_STREAM_MAXLEN = 100_000
DEAD_STREAM_MAXLEN = 10_000

_CLIENT_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_DIGEST = re.compile(r"^[0-9a-f]{16}$")
_JOB_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_FIELDS = ("v", "job_id", "reply_to", "key", "deadline", "payload", "sig")
_BUDGET_FIELDS = ("submitted", "budget_ms")
"""Optional signed fields: a job without them has no budget of its own (its task's default may apply)."""
_JOB_TAG = "examlops.bus.v" + FORMAT


class MalformedJob(InvalidInput):
    """A job that cannot be read: dead-lettered with this reason, never answered."""

    code = "malformed_job"


class UnknownKey(MalformedJob):
    """The job names a key id no identity has: dead-lettered, never answered."""

    code = "unknown_key"


class BadSignature(MalformedJob):
    """Unsigned, signed with another key, altered after signing, or copied onto another address's stream:
    dead-lettered, never answered (an answer would reach the real job's caller)."""

    code = "bad_signature"


class Undeliverable(ExamlopsError):
    """Delivered more than ``MAX_DELIVERIES`` times without an answer (bridges died under it): dead-lettered."""

    code = "undeliverable"


def done_ttl(deadline: float | None, now: float) -> int:
    """Seconds a job's done key lives: to its deadline plus ``DONE_MARGIN_S``, at most ``DONE_TTL_S``.

    Keyed to the job's own budget rather than the longest one allowed: a done key per job is most of the
    bus's memory in Redis (figures in bench/RESULTS.md).
    """
    remaining = 0.0 if deadline is None else max(0.0, deadline - now)
    return int(min(DONE_TTL_S, remaining + DONE_MARGIN_S))


def jobs_stream(address: str) -> str:
    return JOBS_PREFIX + address


def replies_stream(client_id: str) -> str:
    if not _CLIENT_ID.match(client_id):
        raise InvalidInput(f"client id {client_id[:70]!r} must be 1-64 of A-Z a-z 0-9 _ . -", field="client_id")
    return REPLIES_PREFIX + client_id


def done_key(job_id: str) -> str:
    return f"{PREFIX}:done:{job_id}"


class DoneReply(NamedTuple):
    """A done key's reply: the digest of the request it answered (``Job.digest``), its stream and entry id."""

    digest: str
    stream: str
    entry_id: str


def reply_location(done: str) -> DoneReply | None:
    """A done key's reply, read off its value (``token\\ndigest\\nclient id\\nentry id``, written by
    ``scripts.REPLY_SCRIPT``); None for a done key that names none (a dead letter's, an older one)."""
    parts = done.split("\n")
    if len(parts) != 4 or not _DIGEST.match(parts[1]) or not _CLIENT_ID.match(parts[2]) or not parts[3]:
        return None
    return DoneReply(parts[1], REPLIES_PREFIX + parts[2], parts[3])


def address_of(stream: str) -> str:
    return stream.removeprefix(JOBS_PREFIX)


def is_reply_stream(name: str) -> bool:
    """Only keys in the reply namespace may receive replies: a forged ``reply_to`` cannot write elsewhere."""
    return name.startswith(REPLIES_PREFIX) and bool(_CLIENT_ID.match(name.removeprefix(REPLIES_PREFIX)))


@dataclass(frozen=True, slots=True)
class Job:
    """One verified job. ``payload`` holds ``embedding``, ``node_count`` and optionally ``alias``;
    ``key_id`` names the identity whose key signed it.

    ``deadline`` is the job's own: the earlier of the signed deadline and ``submitted_at`` + ``budget_ms``.
    ``budget_ms`` is the budget the job declared, or the one its task gave it (``with_default_budget``);
    None: the job has only its deadline."""

    job_id: str
    address: str
    reply_to: str
    key_id: str
    deadline: float
    payload: Mapping[str, Any]
    budget_ms: float | None = None
    submitted_at: float | None = None
    digest: str = field(default="", compare=False)
    """16 hex of SHA-256 over the JSON array of the address and the payload exactly as signed
    (``decode_job``): what a retry must repeat to get this job's reply; empty for a job not read from the
    wire."""

    def with_default_budget(self, budget_ms: float | None, submitted_at: float | None) -> Job:
        """This job with ``budget_ms`` (a task's default) when it declared none, counted from its submission
        (``submitted_at``, else the given time): the deadline only ever moves earlier."""
        if budget_ms is None or self.budget_ms is not None:
            return self
        start = self.submitted_at if self.submitted_at is not None else submitted_at
        if start is None:
            return self
        deadline = budget.deadline_of(self.deadline, start, budget_ms)
        return replace(self, deadline=deadline, budget_ms=budget_ms, submitted_at=start)

    def expired(self, now: float) -> DeadlineExceeded | None:
        """The refusal of a job whose deadline has passed (its caller gave up), else None."""
        if self.deadline >= now:
            return None
        return DeadlineExceeded(f"the job's deadline passed {now - self.deadline:.3f} s ago; it was not served")


def _job_signature(key: bytes, address: str, f: Mapping[str, str]) -> str:
    items: list[str | int] = [_JOB_TAG, f["job_id"], address, f["reply_to"], f["key"], f["deadline"], f["payload"]]
    if any(name in f for name in _BUDGET_FIELDS):
        items += [f.get(name, "") for name in _BUDGET_FIELDS]
    return sign(key, items)


def encode_job(
    key_id: str,
    key: bytes,
    *,
    address: str,
    job_id: str,
    reply_to: str,
    deadline: float,
    payload: Mapping[str, Any],
    submitted: float | None = None,
    budget_ms: float | None = None,
) -> dict[str, str]:
    """The stream fields of a job signed with ``key`` (the bus key of ``key_id``'s identity); ``submitted``
    (the client's clock now) is required with a ``budget_ms``.

    ``InvalidInput`` for a payload that is not plain finite JSON, or a budget that is not a positive number
    of milliseconds up to ``budget.MAX_JOB_BUDGET_MS``.
    """
    if budget_ms is not None:
        budget.check_budget(budget_ms)
        if submitted is None:
            raise InvalidInput("a job's budget needs its submission time", field="submitted")
    try:
        body = canonical(payload)
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
        raise InvalidInput(f"the payload is not plain JSON of finite numbers ({exc})", field="payload") from exc
    fields = {
        "v": FORMAT,
        "job_id": job_id,
        "reply_to": reply_to,
        "key": key_id,
        "deadline": repr(float(deadline)),
        "payload": body,
    }
    if submitted is not None:
        fields["submitted"] = repr(float(submitted))
    if budget_ms is not None:
        fields["budget_ms"] = repr(float(budget_ms))
    fields["sig"] = _job_signature(key, address, fields)
    return fields


def job_key_id(raw: Mapping[str, str]) -> str:
    """The key id a job claims (not yet believed): ``MalformedJob`` when the job lacks a field, has another
    format, or its key id, job id or reply address cannot be one."""
    missing = [name for name in _FIELDS if name not in raw]
    if missing:
        kind = BadSignature if missing == ["sig"] else MalformedJob
        raise kind(f"the job lacks {', '.join(missing)}")
    if raw["v"] != FORMAT:
        raise MalformedJob(f"unknown job format {str(raw['v'])[:16]!r}")
    if not _JOB_ID.match(raw["job_id"]) or not is_reply_stream(raw["reply_to"]):
        raise MalformedJob("the job id or reply address is not valid")
    key_id = raw["key"]
    if not _KEY_ID.match(key_id):
        raise MalformedJob("the key id is not valid")
    return key_id


def decode_job(key: bytes, address: str, raw: Mapping[str, str], now: float) -> Job:
    """Verify and read one job with the bus key of its key id: ``MalformedJob`` or ``BadSignature``.

    The signature is checked before anything else is believed, so a refused job tells nothing about the
    payload. An expired job is read (see ``Job.expired``); a deadline more than ``MAX_JOB_TTL_S`` ahead is
    refused (a done key must outlive every valid job).
    """
    key_id = job_key_id(raw)
    if not matches(_job_signature(key, address, raw), raw["sig"]):
        raise BadSignature("the job's signature does not match: unsigned, another key, altered, or moved")
    try:
        deadline = float(raw["deadline"])
        payload = orjson.loads(raw["payload"])  # strict: NaN, Infinity and 1e309 are refused
    except ValueError as exc:
        raise MalformedJob(f"the deadline or payload cannot be read ({exc})") from exc
    if not math.isfinite(deadline) or not isinstance(payload, dict):
        raise MalformedJob("the deadline must be a finite number and the payload an object")
    if deadline - now > MAX_JOB_TTL_S:
        raise MalformedJob(f"the deadline lies more than {MAX_JOB_TTL_S:.0f} s ahead")
    try:
        submitted, budget_ms = budget.read_budget(raw)
    except ValueError as exc:
        raise MalformedJob(f"the submission time or budget cannot be read ({exc})") from exc
    if budget_ms is not None and submitted is not None:
        deadline = budget.deadline_of(deadline, submitted, budget_ms)
    # The JSON array [address, payload] of the payload text as signed: for a payload our clients encode, the
    # same bytes as ``canonical([address, payload])`` (done keys of earlier releases match), at any depth.
    digest = hashlib.sha256(f"[{orjson.dumps(address).decode()},{raw['payload']}]".encode()).hexdigest()[:16]
    return Job(raw["job_id"], address, raw["reply_to"], key_id, deadline, payload, budget_ms, submitted, digest)
