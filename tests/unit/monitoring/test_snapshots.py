"""Drift snapshots: embedding statistics and the stream fields."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from typing import Any

import pytest

from examlops.core.records import ServedInference, embedding_stats
from examlops.monitoring.audit import Entry
from examlops.monitoring.recording import row_of, written_key
from examlops.monitoring.snapshots import PACKED, Snapshot, snapshot_of, stream_of


def test_embedding_stats_are_l2_norm_mean_and_population_std() -> None:
    embedding = [0.5, -1.0, 2.0, 0.25]
    norm, mean, std = embedding_stats(embedding)
    assert norm == pytest.approx(math.sqrt(sum(x * x for x in embedding)))
    assert mean == pytest.approx(statistics.fmean(embedding))
    assert std == pytest.approx(statistics.pstdev(embedding))


def test_an_empty_embedding_has_zero_stats() -> None:
    assert embedding_stats([]) == (0.0, 0.0, 0.0)


def test_the_stats_of_numpy_floats_are_plain_floats() -> None:
    import numpy as np

    stats = embedding_stats(list(np.array([0.5, -1.0, 2.0])))
    assert all(type(value) is float for value in stats)


@pytest.mark.parametrize("seed", range(5))
def test_the_stats_match_the_two_pass_definition_to_nine_digits(seed: int) -> None:
    import random

    rng = random.Random(seed)
    for center, spread in ((0.0, 0.05), (0.3, 1.0), (-2.0, 0.001), (50.0, 0.1)):
        embedding = [rng.gauss(center, spread) for _ in range(384)]
        norm, mean, std = embedding_stats(embedding)
        assert norm == pytest.approx(math.sqrt(math.fsum(x * x for x in embedding)), rel=1e-12)
        assert mean == pytest.approx(statistics.fmean(embedding), rel=1e-12, abs=1e-15)
        assert std == pytest.approx(statistics.pstdev(embedding), rel=1e-9)


def test_a_large_mean_does_not_cancel_the_spread_away() -> None:
    embedding = [1e6 + 0.001 * i for i in range(384)]
    assert embedding_stats(embedding)[2] == pytest.approx(statistics.pstdev(embedding), rel=1e-6)
    assert embedding_stats([5.0] * 384)[2] == 0.0


def test_a_served_reply_becomes_a_snapshot_that_reads_back_from_its_fields() -> None:
    reply = {"model": "JPCP", "alias": "Canary", "version": "2", "run_id": "abc", "prediction": 0.75, "error": None}
    snapshot = snapshot_of(
        model="JPCP", reply=reply, status=200, embedding=[1.0, 2.0], node_count=7, job_id="j1", user_id="u", ts=5.5
    )
    assert snapshot.ok and snapshot.code == ""
    back = Snapshot.from_fields("1-0", snapshot.fields())
    assert back == dataclasses.replace(snapshot, entry_id="1-0")
    side = snapshot.side_write()
    assert side.stream == stream_of("jpcp") == "examlops:snapshots:jpcp" and side.member == "jpcp"
    assert side.names == ("s",) and json.loads(side.values[0]) == [
        "JPCP", "Canary", "2", "abc", 0.75, snapshot.norm, snapshot.mean, snapshot.std, 7, "j1", "u", 5.5, 200, "",
    ]  # fmt: skip
    assert Snapshot.from_fields("1-0", side.fields) == back


def test_an_entry_of_one_field_per_value_is_not_a_snapshot() -> None:
    unpacked = {
        "model": "JPCP", "alias": "Production", "version": "3", "run_id": "r", "prediction": "0.5", "norm": "2.0",
        "mean": "0.1", "std": "0.3", "node_count": "12", "job_id": "j", "user_id": "u", "ts": "1700000000.5",
        "status": "200", "code": "",
    }  # fmt: skip
    with pytest.raises(KeyError):
        Snapshot.from_fields("7-0", unpacked)


@pytest.mark.parametrize(
    "value",
    [
        "not json",
        "[1, 2]",
        '{"model": "JPCP"}',
        '["JPCP", "P", "3", "r", "0.5", 2.0, 0.1, 0.3, 12, "j", "u", 1.0, 200, ""]',  # a number as text
        '["JPCP", "P", "3", "r", 0.5, 2.0, 0.1, 0.3, 12.5, "j", "u", 1.0, 200, ""]',  # a fractional count
        '["JPCP", "P", 3, "r", 0.5, 2.0, 0.1, 0.3, 12, "j", "u", 1.0, 200, ""]',  # a version as a number
        '["JPCP", "P", "3", "r", null, 2.0, 0.1, 0.3, 12, "j", "u", 1.0, 200, ""]',
    ],
)
def test_an_entry_that_is_not_a_snapshot_is_refused(value: str) -> None:
    with pytest.raises(ValueError):
        Snapshot.from_fields("1-0", {"s": value})


def test_an_error_reply_is_marked_with_its_code() -> None:
    reply = {"error": "embedding: bad", "prediction": 0.0, "code": "invalid_input", "model": "JPCP"}
    snapshot = snapshot_of(
        model="JPCP", reply=reply, status=0, embedding=(), node_count=0, job_id="j", user_id="u", ts=1.0
    )
    assert not snapshot.ok and snapshot.code == "invalid_input" and snapshot.version == ""


@pytest.mark.parametrize(
    ("reply", "status"),
    [
        (
            {
                "model": "JPCP",
                "alias": "Canary",
                "version": "2",
                "run_id": "abc",
                "prediction": 0.75,
                "error": None,
                "trace": "ab" * 16,
            },
            200,
        ),
        ({"error": "embedding: bad", "prediction": 0.0, "code": "invalid_input", "model": "JPCP"}, 422),
        ({"error": "boom", "prediction": math.nan, "inference_failed": True, "model": "JPCP"}, 500),
        ({"alias": "Production", "version": 3, "prediction": 2}, 200),
    ],
)
def test_the_recorders_entry_holds_the_snapshot_and_the_event_of_a_reply(reply: dict[str, Any], status: int) -> None:
    norm, mean, std = embedding_stats((1.0, 2.0, -0.5))
    served = ServedInference(
        job_id="j1", address="a", model="JPCP", caller="u", node_count=7, reply=reply, status=status,
        served_at=1732900000.25, norm=norm, mean=mean, std=std, entry_id="5-0",
    )  # fmt: skip
    row = row_of(served)
    snapshot = snapshot_of(
        model="JPCP", reply=reply, status=status, embedding=[1.0, 2.0, -0.5], node_count=7, job_id="j1",
        user_id="u", ts=1732900000.25,
    )  # fmt: skip
    stored = Snapshot.from_fields("1-0", dict(zip(PACKED, row[2], strict=True)))
    assert stored.alias == str(reply.get("alias") or "")
    data = {
        "job_id": "j1", "user_id": "u", "alias": stored.alias, "version": stored.version, "run_id": stored.run_id,
        "prediction": stored.prediction, "status": status, "code": stored.code, "trace": reply.get("trace", ""),
    }  # fmt: skip
    assert json.loads(row[8]) == data
    # Exactly what the generic path (an Entry with the snapshot as its side write) hands the append script.
    side = snapshot.side_write()
    assert row == Entry("inference.served", "JPCP", data, 1732900000.25, written_key("5-0"), side).row()
    assert row[0] == "examlops:recorded:5-0", "the once key of its record entry"


def test_statistics_that_overflow_to_infinity_are_stored_and_read_back() -> None:
    snapshot = snapshot_of(
        model="JPCP", reply={"prediction": 1.0, "error": None}, status=200, embedding=[1e308, 1e308], node_count=2,
        job_id="j", user_id="u", ts=1.0,
    )  # fmt: skip
    assert math.isinf(snapshot.mean)
    back = Snapshot.from_fields("1-0", snapshot.fields())
    assert (back.norm, back.mean, back.std) == (snapshot.norm, snapshot.mean, snapshot.std)
    with pytest.raises(ValueError):
        Snapshot.from_fields("1-0", {"s": snapshot.fields()["s"].replace('"inf"', '"lots"', 1)})
