"""The wire format of the bus: stream names, signed jobs, replies and the reply script.

Pure: no redis, no I/O. ``store`` runs what is defined here against Redis.

Streams and keys::

    examlops:bus:jobs:{uuid}          jobs for one model, by its catalog ``seanerbus_uuid``; group ``bridges``
    examlops:bus:replies:{client_id}  one per client; capped (MAXLEN ~) and expiring, so abandoned ones vanish
    examlops:bus:done:{job_id}        set once, when a job's reply is written: exactly one reply per job id
    examlops:bus:dead                 dead letters: malformed, refused and over-delivered jobs, with the reason
    examlops:bus:handlers             hash uuid -> last heartbeat of a bridge serving it
    examlops:bus:addresses            set of the uuids with a job stream: bridges find orphans without a SCAN

A producer puts a job on its model's stream and adds the address to
``examlops:bus:addresses`` in one step (``SUBMIT_SCRIPT``; a bridge also adds
every job stream it finds with one SCAN when it starts).

A job entry's fields: ``v`` (format version), ``job_id``, ``reply_to`` (a reply
stream key), ``caller``, ``deadline`` (absolute UNIX seconds, also the
signature's expiry), ``payload`` (canonical JSON) and ``sig``: hex
HMAC-SHA256 with ``settings.secret`` over the canonical JSON array of the
format tag, job id, model address, reply stream, caller, deadline and
payload, exactly as they travel. The address is not a field: it is the stream
the job was read from, so a job copied onto another model's stream is refused.

A reply entry's fields: ``job_id``, ``status`` (the HTTP status from serving,
0 when serving was not asked) and ``body``: the HTTP reply's JSON (model,
alias, version, run_id, prediction, error, job_id) or an error body (error,
prediction 0.0, code, field, inference_failed, model, job_id).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from examlops.core import keys
from examlops.core.errors import DeadlineExceeded, ExamlopsError, InvalidInput
from examlops.core.jsoncodec import ascii_array, canonical

FORMAT = "1"
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
_JOB_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_FIELDS = ("v", "job_id", "reply_to", "caller", "deadline", "payload", "sig")


class MalformedJob(InvalidInput):
    """A job that cannot be read. ``reply_to`` and ``job_id`` are set when they could be read safely."""

    code = "malformed_job"

    def __init__(self, message: str, *, reply_to: str | None = None, job_id: str | None = None) -> None:
        super().__init__(message)
        self.reply_to = reply_to
        self.job_id = job_id


class BadSignature(MalformedJob):
    """Unsigned, signed with another secret, or altered after signing: never served."""

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


def address_of(stream: str) -> str:
    return stream.removeprefix(JOBS_PREFIX)


def is_reply_stream(name: str) -> bool:
    """Only keys in the reply namespace may receive replies: a forged ``reply_to`` cannot write elsewhere."""
    return name.startswith(REPLIES_PREFIX) and bool(_CLIENT_ID.match(name.removeprefix(REPLIES_PREFIX)))


@dataclass(frozen=True, slots=True)
class Job:
    """One verified job. ``payload`` holds ``embedding``, ``node_count`` and optionally ``alias``."""

    job_id: str
    address: str
    reply_to: str
    caller: str
    deadline: float
    payload: Mapping[str, Any]

    def expired(self, now: float) -> DeadlineExceeded | None:
        """The refusal of a job whose deadline has passed (its caller gave up), else None."""
        if self.deadline >= now:
            return None
        return DeadlineExceeded(f"the job's deadline passed {now - self.deadline:.3f} s ago; it was not served")


def _signature(secret: bytes, address: str, fields: Mapping[str, str]) -> str:
    """HMAC-SHA256 over the ASCII JSON array of the signed fields (``jsoncodec.ascii_array``)."""
    f = fields
    message = ascii_array(
        ["examlops.bus.v" + FORMAT, f["job_id"], address, f["reply_to"], f["caller"], f["deadline"], f["payload"]]
    )
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def encode_job(
    secret: bytes, *, address: str, job_id: str, reply_to: str, caller: str, deadline: float, payload: Mapping[str, Any]
) -> dict[str, str]:
    """The stream fields of a signed job. ``InvalidInput`` for a payload that is not plain finite JSON."""
    try:
        body = canonical(payload)
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
        raise InvalidInput(f"the payload is not plain JSON of finite numbers ({exc})", field="payload") from exc
    fields = {
        "v": FORMAT,
        "job_id": job_id,
        "reply_to": reply_to,
        "caller": caller,
        "deadline": repr(float(deadline)),
        "payload": body,
    }
    fields["sig"] = _signature(secret, address, fields)
    return fields


def decode_job(secret: bytes, address: str, raw: Mapping[str, str], now: float) -> Job:
    """Verify and read one job: ``MalformedJob`` or ``BadSignature``; an expired job is read (see ``Job.expired``).

    The signature is checked before anything is believed, so a refused job
    tells nothing about the payload. The reply address is given back on the
    error only when it lies in the reply namespace.
    """
    fields = {str(k): str(v) for k, v in raw.items()}
    job_id = fields.get("job_id", "")
    reply_to = fields.get("reply_to", "")
    seen = dict(
        reply_to=reply_to if is_reply_stream(reply_to) else None, job_id=job_id if _JOB_ID.match(job_id) else None
    )
    missing = [name for name in _FIELDS if name not in fields]
    if missing:
        kind = BadSignature if missing == ["sig"] else MalformedJob
        raise kind(f"the job lacks {', '.join(missing)}", **seen)
    if fields["v"] != FORMAT:
        raise MalformedJob(f"unknown job format {fields['v'][:16]!r}", **seen)
    if seen["job_id"] is None or seen["reply_to"] is None:
        raise MalformedJob("the job id or reply address is not valid", **seen)
    if not hmac.compare_digest(_signature(secret, address, fields), fields["sig"]):
        raise BadSignature("the job's signature does not match: unsigned, another secret, or altered", **seen)
    try:
        deadline = float(fields["deadline"])
        payload = orjson.loads(fields["payload"])  # strict: NaN, Infinity and 1e309 are refused
    except ValueError as exc:
        raise MalformedJob(f"the deadline or payload cannot be read ({exc})", **seen) from exc
    if not math.isfinite(deadline) or not isinstance(payload, dict):
        raise MalformedJob("the deadline must be a finite number and the payload an object", **seen)
    if deadline - now > MAX_JOB_TTL_S:
        raise MalformedJob(f"the deadline lies more than {MAX_JOB_TTL_S:.0f} s ahead", **seen)
    return Job(job_id, address, reply_to, fields["caller"], deadline, payload)


def error_body(error: ExamlopsError, *, model: str | None = None, job_id: str | None = None) -> dict[str, Any]:
    """The error reply, in the shape of serving's ``ErrorReply``: a message, a prediction of 0.0 and the kind."""
    return {
        "error": error.message,
        "prediction": 0.0,
        "code": error.code,
        "field": error.field,
        "inference_failed": error.model_failure,
        "model": model,
        "job_id": job_id,
    }


def reply_fields(job_id: str, body: Mapping[str, Any], status: int = 0) -> dict[str, str]:
    return {"job_id": job_id, "status": str(status), "body": orjson.dumps(body).decode()}


def read_reply(raw: Mapping[str, str]) -> tuple[str, dict[str, Any]]:
    """(job id, body) of one reply entry; a body that is not an object becomes an error body."""
    try:
        body = orjson.loads(raw.get("body", ""))
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        body = error_body(MalformedJob("the bridge sent an unreadable reply"))
    return raw.get("job_id", ""), body
