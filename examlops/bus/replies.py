"""Reply entries on the bus: what a bridge writes to a job's reply stream, and how a client believes it.

A reply entry's fields: ``job_id``, ``status`` (the HTTP status from serving,
0 when serving was not asked), ``body`` (the HTTP reply's JSON: model, alias,
version, run_id, prediction, error, job_id, budget_ms, budget_remaining_ms, and
task for a task's address; or an error body: error, prediction 0.0, code, field,
inference_failed, model, job_id; a refusal adds refused, estimate_ms and
retry_after_s), ``key`` (the job's key id) and ``sig``: hex HMAC-SHA256 with the job's
bus key over the canonical JSON array of the reply format tag, job id, status,
body and key id (``signing``). Only the bridge that verified the job (it holds the key) and
the job's sender can make it; the client ignores a reply it cannot verify (``verify_reply`` gives None,
never an error). Pure: no redis, no I/O; the job side of the format is ``wire``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from examlops.bus.signing import matches, sign
from examlops.bus.wire import FORMAT
from examlops.core.errors import ExamlopsError, Forbidden

REPLY_TAG = "examlops.bus.reply.v" + FORMAT


def error_body(error: ExamlopsError, *, model: str | None = None, job_id: str | None = None) -> dict[str, Any]:
    """The error reply, in the shape of serving's ``ErrorReply``: a message, a prediction of 0.0 and the kind;
    a ``forbidden`` one also names the ``permission`` the identity lacks, as serving's 403 does."""
    body: dict[str, Any] = {
        "error": error.message,
        "prediction": 0.0,
        "code": error.code,
        "field": error.field,
        "inference_failed": error.model_failure,
        "model": model,
        "job_id": job_id,
    }
    if isinstance(error, Forbidden):
        body["permission"] = error.permission
    return body


def reply_fields(key_id: str, key: bytes, job_id: str, body: Mapping[str, Any], status: int = 0) -> dict[str, str]:
    """A reply entry signed with the job's bus key (``key_id``'s), which only its sender and a bridge hold."""
    fields = {"job_id": job_id, "status": str(status), "body": orjson.dumps(body).decode(), "key": key_id}
    fields["sig"] = sign(key, [REPLY_TAG, job_id, fields["status"], fields["body"], key_id])
    return fields


def verify_reply(key_id: str, key: bytes, raw: Mapping[str, str]) -> tuple[str, dict[str, Any]] | None:
    """(job id, body) of a reply signed with ``key`` for ``key_id``; None when it is not (forged, altered,
    another identity's, or unsigned). A signed body that is not an object becomes an error body."""
    try:
        job_id, status, text, claimed, sig = raw["job_id"], raw["status"], raw["body"], raw["key"], raw["sig"]
    except KeyError:
        return None
    if claimed != key_id or not matches(sign(key, [REPLY_TAG, job_id, status, text, key_id]), sig):
        return None
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        body = error_body(ExamlopsError("the bridge sent an unreadable reply"))
    return job_id, body
