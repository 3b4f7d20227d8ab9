"""The audit event encoding: canonical JSON, the hash over every field, checkpoint signatures."""

from __future__ import annotations

import hashlib
import json
import math

import pytest

from examlops.monitoring.audit import GENESIS, AuditEvent, Entry, canonical_json, event_hash, format_ts
from examlops.monitoring.audit.checkpoints import checkpoint_is_genuine, new_checkpoint, sign_checkpoint


def test_canonical_json_is_one_text_for_one_value() -> None:
    assert canonical_json({"b": 1, "a": [1.5, "é"]}) == '{"a":[1.5,"é"],"b":1}'
    assert canonical_json({"a": [1.5, "é"], "b": 1}) == canonical_json({"b": 1, "a": [1.5, "é"]})


def test_canonical_json_refuses_nan() -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": math.nan})


def test_the_hash_is_sha256_of_the_canonical_array_of_every_field() -> None:
    message = json.dumps(["examlops.audit.v1", 1, "1.000000", "t", "s", "{}", GENESIS], separators=(",", ":"))
    assert event_hash(1, "1.000000", "t", "s", "{}", GENESIS) == hashlib.sha256(message.encode()).hexdigest()


def reference_hash(*fields: object) -> str:
    """The hash as the format defines it, with the standard library's ASCII-escaping JSON."""
    message = json.dumps(["examlops.audit.v1", *fields], separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(message.encode()).hexdigest()


@pytest.mark.parametrize(
    "text",
    [
        "".join(map(chr, range(128))),  # every ASCII character, the control ones and DEL included
        'quote " backslash \\ slash /',
        "é, ✓ and 🚀",  # non-ASCII: escaped in the hashed message
        "lone \ud800 surrogate",
        '{"job_id":"a","code":""}',
    ],
)
def test_the_hash_of_any_text_is_the_formats_reference_hash(text: str) -> None:
    assert event_hash(9, text, text, text, text, text) == reference_hash(9, text, text, text, text, text)


@pytest.mark.parametrize("field", ["seq", "ts", "type", "subject", "data", "prev"])
def test_changing_any_field_changes_the_hash(field: str) -> None:
    event = AuditEvent.chained(7, GENESIS, "1.500000", "inference.served", "JPCP", '{"job_id":"a"}')
    values = {"seq": 8, "ts": "1.500001", "type": "alias.moved", "subject": "jpcp", "data": '{"job_id":"b"}'}
    values["prev"] = "1" * 64
    fields = {name: getattr(event, name) for name in ("seq", "ts", "type", "subject", "data", "prev")}
    fields[field] = values[field]
    assert event_hash(**fields) != event.hash


def test_an_event_reads_back_from_its_stream_fields_and_checks_out() -> None:
    event = AuditEvent.chained(3, "a" * 64, format_ts(1732900000.25), "traffic.changed", "JPCP", '{"Canary":10}')
    stored = dict(zip(("seq", "ts", "type", "subject", "data", "prev", "hash"), event.fields(), strict=True))
    back = AuditEvent.from_fields("1-0", stored)
    assert back.computed_hash() == back.hash == event.hash
    assert back.to_json()["time"] == "2024-11-29T17:06:40.250000+00:00"
    assert back.to_json()["data"] == {"Canary": 10}


def test_entry_data_is_encoded_canonically_once() -> None:
    assert Entry("t", "s", {"b": 2, "a": 1}, 0.0).encoded == '{"a":1,"b":2}'


def test_a_checkpoint_signature_covers_seq_and_head_hash() -> None:
    checkpoint = new_checkpoint(b"secret", 100, "f" * 64, 0.0)
    assert checkpoint_is_genuine(b"secret", checkpoint)
    assert not checkpoint_is_genuine(b"other", checkpoint)
    assert sign_checkpoint(b"secret", 101, "f" * 64) != checkpoint.hmac
    assert sign_checkpoint(b"secret", 100, "e" * 64) != checkpoint.hmac
