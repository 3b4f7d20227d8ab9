"""The bus's wire format: canonical encoding, job signatures, refusals of malformed jobs."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from examlops.bus import wire
from examlops.core.jsoncodec import canonical

SECRET = b"unit-test-bus-key-of-identity-a"
KEY_ID = "keyida01"
ADDRESS = "57dcdb81-15d8-5512-8e93-3f86bc59ad53"
OTHER = "732f7c08-7925-5e14-a8ae-39c2ae757fe8"
NOW = 1_700_000_000.0
REPLY_TO = wire.replies_stream("client-1")


def signed(**overrides: Any) -> dict[str, str]:
    args: dict[str, Any] = {
        "address": ADDRESS,
        "job_id": "job-1",
        "reply_to": REPLY_TO,
        "deadline": NOW + 5,
        "payload": {"node_count": 3, "embedding": [0.1, -2.5e-7, 3.0], "alias": "canary"},
    }
    args.update(overrides)
    key_id = args.pop("key_id", KEY_ID)
    return wire.encode_job(key_id, args.pop("key", SECRET), **args)


def test_a_signed_job_round_trips_exactly() -> None:
    job = wire.decode_job(SECRET, ADDRESS, signed(), NOW)
    assert job == wire.Job(
        job_id="job-1",
        address=ADDRESS,
        reply_to=REPLY_TO,
        key_id=KEY_ID,
        deadline=NOW + 5,
        payload={"node_count": 3, "embedding": [0.1, -2.5e-7, 3.0], "alias": "canary"},
    )


def test_the_payload_encoding_is_canonical_whatever_the_key_order() -> None:
    one = signed(payload={"a": 1, "b": [1.5]})
    two = signed(payload={"b": [1.5], "a": 1})
    assert one == two
    assert one["payload"] == '{"a":1,"b":[1.5]}'


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("payload", json.dumps({"node_count": 4, "embedding": [0.1, -2.5e-7, 3.0], "alias": "canary"})),
        ("key", "keyidb02"),
        ("deadline", repr(NOW + 500)),
        ("job_id", "job-2"),
        ("reply_to", wire.replies_stream("client-2")),
        ("sig", "0" * 64),
        ("sig", "é" * 64),  # not ASCII: no match, never a TypeError out of the comparison
    ],
)
def test_an_altered_job_is_refused(field: str, value: str) -> None:
    fields = signed()
    fields[field] = value
    with pytest.raises(wire.BadSignature):
        wire.decode_job(SECRET, ADDRESS, fields, NOW)


def test_a_job_moved_to_another_models_stream_is_refused() -> None:
    with pytest.raises(wire.BadSignature):
        wire.decode_job(SECRET, OTHER, signed(), NOW)


def test_a_job_signed_with_another_identitys_key_is_refused() -> None:
    with pytest.raises(wire.BadSignature):
        wire.decode_job(b"another", ADDRESS, signed(), NOW)


def test_a_job_that_claims_another_key_id_than_the_one_it_was_signed_for_is_refused() -> None:
    """Signed by identity B with its own key but naming A's key id: verified with A's key, it fails."""
    forged = signed(key_id=KEY_ID, key=b"the bus key of identity b")
    with pytest.raises(wire.BadSignature):
        wire.decode_job(SECRET, ADDRESS, forged, NOW)


def test_an_unsigned_job_is_refused() -> None:
    fields = signed()
    del fields["sig"]
    with pytest.raises(wire.BadSignature):
        wire.decode_job(SECRET, ADDRESS, fields, NOW)


def test_the_key_id_a_job_claims_is_read_before_its_signature_is_checked() -> None:
    assert wire.job_key_id(signed()) == KEY_ID
    fields = signed()
    fields["key"] = "a key id with spaces"
    with pytest.raises(wire.MalformedJob, match="key id"):
        wire.job_key_id(fields)


def test_an_expired_job_is_read_but_reports_its_deadline_passed() -> None:
    job = wire.decode_job(SECRET, ADDRESS, signed(deadline=NOW - 0.5), NOW)
    expired = job.expired(NOW)
    assert expired is not None and expired.code == "deadline_exceeded"
    assert job.expired(NOW - 1) is None


def test_a_deadline_too_far_ahead_is_refused_so_done_keys_outlive_every_job() -> None:
    with pytest.raises(wire.MalformedJob, match="ahead"):
        wire.decode_job(SECRET, ADDRESS, signed(deadline=NOW + wire.MAX_JOB_TTL_S + 1), NOW)
    assert wire.DONE_TTL_S > wire.MAX_JOB_TTL_S


def test_a_done_key_lives_to_its_jobs_deadline_plus_the_margin() -> None:
    assert wire.done_ttl(NOW + 30, NOW) == 30 + wire.DONE_MARGIN_S
    assert wire.done_ttl(NOW - 5, NOW) == wire.DONE_MARGIN_S  # expired, or unreadable (None): the margin
    assert wire.done_ttl(None, NOW) == wire.DONE_MARGIN_S
    assert wire.done_ttl(NOW + wire.MAX_JOB_TTL_S, NOW) == wire.DONE_TTL_S


@pytest.mark.parametrize("missing", ["job_id", "reply_to", "payload", "deadline", "v", "key"])
def test_a_job_missing_a_field_is_malformed(missing: str) -> None:
    fields = signed()
    del fields[missing]
    with pytest.raises(wire.MalformedJob) as refused:
        wire.decode_job(SECRET, ADDRESS, fields, NOW)
    assert type(refused.value) is wire.MalformedJob


@pytest.mark.parametrize("reply_to", ["examlops:audit", "examlops:bus:replies:", "examlops:bus:replies:a b", "x" * 10])
def test_a_reply_address_outside_the_reply_namespace_is_malformed_even_when_signed(reply_to: str) -> None:
    with pytest.raises(wire.MalformedJob, match="reply address"):
        wire.decode_job(SECRET, ADDRESS, signed(reply_to=reply_to), NOW)


def test_a_job_of_the_previous_format_is_malformed() -> None:
    fields = signed()
    fields["v"] = "1"
    with pytest.raises(wire.MalformedJob, match="format"):
        wire.job_key_id(fields)


def test_an_unreadable_payload_with_a_valid_signature_is_malformed() -> None:
    fields = signed()
    fields["payload"] = "[NaN"
    fields["sig"] = wire._job_signature(SECRET, ADDRESS, fields)
    with pytest.raises(wire.MalformedJob, match="cannot be read"):
        wire.decode_job(SECRET, ADDRESS, fields, NOW)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_payload_with_a_non_finite_number_cannot_be_encoded(bad: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        signed(payload={"embedding": [0.5, bad], "node_count": 1})


def test_a_real_null_and_the_text_null_still_encode() -> None:
    payload = {"embedding": [0.5], "node_count": 1, "alias": None, "note": "nullable"}
    job = wire.decode_job(SECRET, ADDRESS, signed(payload=payload), NOW)
    assert job.payload == payload


@pytest.mark.parametrize("number", ["1e309", "-1e400", "NaN", "Infinity"])
def test_a_signed_payload_with_a_number_that_is_not_finite_is_malformed(number: str) -> None:
    fields = signed()
    fields["payload"] = '{"embedding":[' + number + '],"node_count":1}'
    fields["sig"] = wire._job_signature(SECRET, ADDRESS, fields)
    with pytest.raises(wire.MalformedJob, match="cannot be read"):
        wire.decode_job(SECRET, ADDRESS, fields, NOW)


def test_an_unknown_format_version_is_malformed() -> None:
    fields = signed()
    fields["v"] = "9"
    with pytest.raises(wire.MalformedJob, match="format"):
        wire.decode_job(SECRET, ADDRESS, fields, NOW)


def test_client_ids_are_checked_before_they_name_a_stream() -> None:
    with pytest.raises(ValueError):
        wire.replies_stream("a:b")


def test_a_job_signed_over_the_standard_librarys_json_still_verifies() -> None:
    """The signed message's bytes are fixed by the format, whichever encoder wrote them (here: non-ASCII)."""
    import hashlib
    import hmac

    fields = signed(payload={"node_count": 3, "embedding": [0.5], "alias": "canaré"})
    message = json.dumps(
        ["examlops.bus.v" + wire.FORMAT, fields["job_id"], ADDRESS, fields["reply_to"], fields["key"],
         fields["deadline"], fields["payload"]],
        separators=(",", ":"), ensure_ascii=True,
    )  # fmt: skip
    fields["sig"] = hmac.new(SECRET, message.encode(), hashlib.sha256).hexdigest()
    assert wire.decode_job(SECRET, ADDRESS, fields, NOW).payload["alias"] == "canaré"


def test_a_done_keys_value_names_the_request_it_answered_and_where_its_reply_is_or_nothing() -> None:
    where = wire.reply_location("bridge-a:1f:7\n0123456789abcdef\nc-1\n1700000000000-3")
    assert where == ("0123456789abcdef", wire.replies_stream("c-1"), "1700000000000-3")
    assert wire.reply_location("bridge-a:1f:7") is None  # a dead letter's
    stream = wire.replies_stream("c-1")
    assert wire.reply_location(f"bridge-a:1f:7\n{stream}\n1-0") is None  # written before digests: never resent
    assert wire.reply_location("token\nnot-a-digest\nc-1\n1-0") is None


def test_a_jobs_digest_changes_with_its_address_or_payload_and_nothing_else() -> None:
    job = wire.decode_job(SECRET, ADDRESS, signed(), NOW)
    retry = signed(reply_to=wire.replies_stream("other"), deadline=NOW + 9)  # another client, a later deadline
    assert len(job.digest) == 16 and wire.decode_job(SECRET, ADDRESS, retry, NOW).digest == job.digest
    # As done keys of the release before hold it: their retries still match.
    assert job.digest == hashlib.sha256(canonical([ADDRESS, job.payload]).encode()).hexdigest()[:16]
    other_payload = signed(payload={**job.payload, "node_count": 13})
    assert wire.decode_job(SECRET, ADDRESS, other_payload, NOW).digest != job.digest
    assert wire.decode_job(SECRET, OTHER, signed(address=OTHER), NOW).digest != job.digest


def test_a_digest_is_taken_of_the_payload_as_signed_however_deep_it_nests() -> None:
    # orjson reads 1,024 levels but writes at most 254: a sender of another make may send what we cannot encode
    fields = signed() | {"payload": '{"node_count":3,"embedding":[0.1],"x":' + "[" * 300 + "]" * 300 + "}"}
    fields["sig"] = wire._job_signature(SECRET, ADDRESS, fields)
    job = wire.decode_job(SECRET, ADDRESS, fields, NOW)
    assert len(job.digest) == 16 and job.digest == wire.decode_job(SECRET, ADDRESS, dict(fields), NOW).digest
