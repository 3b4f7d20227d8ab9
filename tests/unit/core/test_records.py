"""The served record's entry on the records stream: written by the bridge, read back by a recorder."""

from __future__ import annotations

import math

import orjson
import pytest

from examlops.core.records import ServedInference, embedding_stats, read_record


def record(**changes: object) -> ServedInference:
    norm, mean, std = embedding_stats((3.0, 4.0))
    values: dict[str, object] = dict(
        job_id="j1", address="addr", model="JPCP", caller="alice", node_count=12,
        reply={"model": "JPCP", "prediction": 0.5, "error": None}, status=200, served_at=1_700_000_000.25,
        norm=norm, mean=mean, std=std,
    )  # fmt: skip
    values.update(changes)
    return ServedInference(**values)  # type: ignore[arg-type]  # the fields, by name


def fields_of(served: ServedInference) -> dict[str, str]:
    """The entry the reply script writes: ``r`` and the reply's own fields."""
    body = orjson.dumps(dict(served.reply)).decode()
    return {"r": served.packed(), "job_id": served.job_id, "status": str(served.status), "body": body}


def test_a_record_reads_back_whole_with_its_entry_id() -> None:
    served = record()
    assert read_record("7-1", fields_of(served)) == record(entry_id="7-1")
    assert (served.norm, served.mean, served.std) == (5.0, 3.5, 0.5)


def test_non_finite_statistics_travel_as_their_repr() -> None:
    back = read_record("1-0", fields_of(record(norm=math.inf, mean=-math.inf, std=math.nan)))
    assert back.norm == math.inf and back.mean == -math.inf and math.isnan(back.std)


def test_the_statistics_of_an_empty_embedding_are_zeros() -> None:
    assert embedding_stats(()) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"r": "[1]", "job_id": "j", "status": "200", "body": "{}"},
        {"r": "not json", "job_id": "j", "status": "200", "body": "{}"},
        {"r": '["a","M","c",1.5,1,0,0,0]', "job_id": "j", "status": "200", "body": "{}"},
        {"r": '["a","M","c",1,1,0,0,0]', "job_id": "j", "status": "x", "body": "{}"},
        {"r": '["a","M","c",1,1,0,0,0]', "job_id": "j", "status": "200", "body": "[]"},
        {"r": '["a","M","c",1,"soon",0,0,0]', "job_id": "j", "status": "200", "body": "{}"},
    ],
)
def test_an_entry_that_is_not_a_record_is_refused(fields: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        read_record("1-0", fields)
