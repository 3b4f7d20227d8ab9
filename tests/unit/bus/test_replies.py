"""Reply entries on the bus: the error body's shape, reply signatures, refusals of altered or forged replies."""

from __future__ import annotations

import pytest

from examlops.bus import replies, wire
from examlops.bus.signing import sign

SECRET = b"unit-test-bus-key-of-identity-a"
KEY_ID = "keyida01"


def test_error_bodies_have_the_http_error_shape() -> None:
    body = replies.error_body(wire.Undeliverable("gone"), model="JPCP", job_id="j")
    assert body == {
        "error": "gone",
        "prediction": 0.0,
        "code": "undeliverable",
        "field": None,
        "inference_failed": False,
        "model": "JPCP",
        "job_id": "j",
    }


REPLY = {"model": "JPCP", "prediction": 0.5, "error": None, "job_id": "job-1"}


def test_a_signed_reply_verifies_with_the_jobs_key() -> None:
    fields = replies.reply_fields(KEY_ID, SECRET, "job-1", REPLY, 200)
    assert fields["key"] == KEY_ID and fields["status"] == "200"
    assert replies.verify_reply(KEY_ID, SECRET, fields) == ("job-1", REPLY)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("body", '{"model":"JPCP","prediction":999.0,"error":null,"job_id":"job-1"}'),
        ("job_id", "job-2"),
        ("status", "500"),
        ("key", "keyidb02"),
        ("sig", "0" * 64),
        ("sig", "é"),
    ],
)
def test_an_altered_reply_does_not_verify(field: str, value: str) -> None:
    fields = replies.reply_fields(KEY_ID, SECRET, "job-1", REPLY, 200)
    fields[field] = value
    assert replies.verify_reply(KEY_ID, SECRET, fields) is None


def test_a_forged_reply_unsigned_or_signed_with_another_key_does_not_verify() -> None:
    unsigned = {"job_id": "job-1", "status": "200", "body": '{"prediction":999.0,"error":null}'}
    assert replies.verify_reply(KEY_ID, SECRET, unsigned) is None
    other = replies.reply_fields(KEY_ID, b"a key the forger made up", "job-1", REPLY | {"prediction": 999.0}, 200)
    assert replies.verify_reply(KEY_ID, SECRET, other) is None
    theirs = replies.reply_fields("keyidb02", b"identity b's own key", "job-1", REPLY, 200)
    assert replies.verify_reply(KEY_ID, SECRET, theirs) is None  # another identity's genuine reply is not ours


def test_a_signed_reply_whose_body_is_not_an_object_becomes_an_error_body() -> None:
    fields = replies.reply_fields(KEY_ID, SECRET, "job-1", REPLY)
    fields["body"] = "[1]"
    fields["sig"] = sign(SECRET, [replies.REPLY_TAG, "job-1", "0", "[1]", KEY_ID])
    verified = replies.verify_reply(KEY_ID, SECRET, fields)
    assert verified is not None and verified[1]["prediction"] == 0.0 and verified[1]["error"]
