"""Property tests (hypothesis) of the bus wire format: the job codec, its signature check, the reply check.

- Whatever a client signs decodes to exactly what it signed.
- Any change to a signed job's fields (any field, any new value), another key, or another address is
  refused as ``MalformedJob`` (``BadSignature`` among them): a bridge never believes an altered job.
- Any mapping of strings whatever is either a job or ``MalformedJob``: never another exception.
- The same for replies: a reply verifies only as signed, and anything else is None, never an exception.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from examlops.bus import replies, wire

NOW = time.time()
KEY, OTHER_KEY = b"k" * 32, b"o" * 32
KEY_ID = "abcdEFGH_1234-xyz"
PROFILE = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

job_ids = st.from_regex(r"\A[A-Za-z0-9_.:-]{1,128}\Z")
client_ids = st.from_regex(r"\A[A-Za-z0-9_.-]{1,64}\Z")
addresses = st.uuids().map(str)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | finite | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
payloads = st.fixed_dictionaries(
    {"embedding": st.lists(finite, max_size=8), "node_count": st.integers(0, 10_000)},
    optional={"alias": st.sampled_from(["Production", "Canary", "staging"]), "extra": json_values},
)
budgets = st.none() | st.floats(min_value=1, max_value=60_000)


@st.composite
def signed_jobs(draw: st.DrawFn) -> tuple[str, dict[str, Any], dict[str, str]]:
    address = draw(addresses)
    spec = {
        "job_id": draw(job_ids),
        "reply_to": wire.replies_stream(draw(client_ids)),
        "deadline": NOW + draw(st.floats(min_value=-100, max_value=3500)),
        "payload": draw(payloads),
    }
    budget_ms = draw(budgets)
    fields = wire.encode_job(
        KEY_ID,
        KEY,
        address=address,
        submitted=NOW if budget_ms is not None else None,
        budget_ms=budget_ms,
        **spec,
    )
    return address, spec, fields


@PROFILE
@given(signed_jobs())
def test_a_signed_job_decodes_to_what_was_signed(job: tuple[str, dict[str, Any], dict[str, str]]) -> None:
    address, spec, fields = job
    decoded = wire.decode_job(KEY, address, fields, NOW)
    assert (decoded.job_id, decoded.address, decoded.reply_to, decoded.key_id) == (
        spec["job_id"],
        address,
        spec["reply_to"],
        KEY_ID,
    )
    assert decoded.payload == spec["payload"]
    assert decoded.deadline <= spec["deadline"]  # a budget only ever tightens it


@PROFILE
@given(signed_jobs(), st.data())
def test_any_altered_field_is_refused(job: tuple[str, dict[str, Any], dict[str, str]], data: st.DataObject) -> None:
    address, _spec, fields = job
    name = data.draw(st.sampled_from(sorted(set(fields) | {"submitted", "budget_ms"})))
    value = data.draw(st.text(max_size=80) | st.sampled_from([fields.get(name, "") + " ", "", "0", "1e309", "NaN"]))
    assume(fields.get(name) != value)
    altered = {**fields, name: value}
    with pytest.raises(wire.MalformedJob):
        wire.decode_job(KEY, address, altered, NOW)


@PROFILE
@given(signed_jobs(), addresses)
def test_another_key_or_another_address_is_a_bad_signature(
    job: tuple[str, dict[str, Any], dict[str, str]], other_address: str
) -> None:
    address, _spec, fields = job
    with pytest.raises(wire.BadSignature):
        wire.decode_job(OTHER_KEY, address, fields, NOW)
    assume(other_address != address)
    with pytest.raises(wire.BadSignature):
        wire.decode_job(KEY, other_address, fields, NOW)


@PROFILE
@given(st.dictionaries(st.sampled_from([*wire._FIELDS, *wire._BUDGET_FIELDS, "x"]), st.text(max_size=40)))
def test_any_mapping_of_texts_is_a_job_or_malformed_never_a_crash(raw: dict[str, str]) -> None:
    with contextlib.suppress(wire.MalformedJob):
        wire.decode_job(KEY, str(uuid.UUID(int=1)), raw, NOW)


@PROFILE
@given(job_ids, json_values, st.integers(0, 599))
def test_a_reply_verifies_only_as_signed(job_id: str, body: Any, status: int) -> None:
    fields = replies.reply_fields(KEY_ID, KEY, job_id, {"value": body}, status)
    assert replies.verify_reply(KEY_ID, KEY, fields) == (job_id, {"value": body})
    assert replies.verify_reply(KEY_ID, OTHER_KEY, fields) is None
    assert replies.verify_reply("another-key-id", KEY, fields) is None
    for name in fields:
        assert replies.verify_reply(KEY_ID, KEY, {**fields, name: fields[name] + "x"}) is None


@PROFILE
@given(st.dictionaries(st.sampled_from(["job_id", "status", "body", "key", "sig", "x"]), st.text(max_size=40)))
def test_any_mapping_of_texts_is_a_reply_or_none_never_a_crash(raw: dict[str, str]) -> None:
    assert replies.verify_reply(KEY_ID, KEY, raw) is None  # unsigned: it cannot verify
