"""Drift snapshots: embedding statistics and the stream fields."""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest

from examlops.monitoring.snapshots import Snapshot, embedding_stats, snapshot_of, stream_of


def test_embedding_stats_are_l2_norm_mean_and_population_std() -> None:
    embedding = [0.5, -1.0, 2.0, 0.25]
    norm, mean, std = embedding_stats(embedding)
    assert norm == pytest.approx(math.sqrt(sum(x * x for x in embedding)))
    assert mean == pytest.approx(statistics.fmean(embedding))
    assert std == pytest.approx(statistics.pstdev(embedding))


def test_an_empty_embedding_has_zero_stats() -> None:
    assert embedding_stats([]) == (0.0, 0.0, 0.0)


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


def test_an_error_reply_is_marked_with_its_code() -> None:
    reply = {"error": "embedding: bad", "prediction": 0.0, "code": "invalid_input", "model": "JPCP"}
    snapshot = snapshot_of(
        model="JPCP", reply=reply, status=0, embedding=(), node_count=0, job_id="j", user_id="u", ts=1.0
    )
    assert not snapshot.ok and snapshot.code == "invalid_input" and snapshot.version == ""
