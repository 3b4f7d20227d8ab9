"""The recording process's frames and its loop, without a process or Redis: a collecting backlog stands in
for the Redis writer."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence

import pytest

from examlops.monitoring.recorder import Backlog, Served, _row
from examlops.monitoring.recorder_process import FRAME, MAX_FRAME, decode_batch, encode_batch, frame, read_frame, serve
from examlops.monitoring.snapshots import embedding_stats
from examlops.serving.bus import ServedInference


def served(job: int, embedding: tuple[float, ...] = (0.5, -0.25, 1.0, 0.0)) -> ServedInference:
    return ServedInference(
        job_id=f"job-{job}",
        address="addr",
        model="JPCP",
        caller="user-1",
        embedding=embedding,
        node_count=12,
        reply={"model": "JPCP", "alias": "Production", "version": "3", "run_id": "r", "prediction": 0.25},
        status=200,
        served_at=1_700_000_000.0 + job,
    )


class Collecting(Backlog):
    def __init__(self) -> None:
        super().__init__(linger_s=0)
        self.written: list[Served] = []

    def _write(self, batch: Sequence[Served]) -> None:
        self.written += batch
        self.recorded += len(batch)


def test_a_batch_crosses_the_pipe_with_the_embedding_statistics_in_place_of_the_embedding() -> None:
    batch = [served(1), served(2, (3.0, 4.0)), served(3, ())]
    body = read_frame(io.BytesIO(encode_batch(batch)))
    assert body is not None
    shipped = decode_batch(body)
    assert [s.job_id for s in shipped] == ["job-1", "job-2", "job-3"]
    assert [s.embedding_stats for s in shipped] == [embedding_stats(s.embedding) for s in batch]
    assert shipped[1].embedding_stats[0] == 5.0 and shipped[2].embedding_stats == (0.0, 0.0, 0.0)
    assert all(s.embedding == () for s in shipped)
    assert [(s.reply, s.status, s.served_at, s.node_count) for s in shipped] == [
        (dict(s.reply), s.status, s.served_at, s.node_count) for s in batch
    ]


def test_a_shipped_record_makes_the_same_snapshot_and_event_as_the_served_one() -> None:
    original = served(7, (0.1, 0.2, -0.3, 0.9))
    body = read_frame(io.BytesIO(encode_batch([original])))
    assert body is not None
    assert _row(decode_batch(body)[0]) == _row(original)


def test_a_frame_cut_short_reads_as_the_end_and_a_huge_one_is_refused() -> None:
    whole = encode_batch([served(1)])
    assert read_frame(io.BytesIO(b"")) is None
    assert read_frame(io.BytesIO(whole[:2])) is None
    assert read_frame(io.BytesIO(whole[:-1])) is None
    with pytest.raises(ValueError, match="out of step"):
        read_frame(io.BytesIO(FRAME.pack(MAX_FRAME + 1)))


def test_serve_records_every_frame_until_eof_then_closes_and_reports_its_totals() -> None:
    backlog = Collecting().start()
    frames = io.BytesIO(
        encode_batch([served(i) for i in range(3)])
        + frame(b"not a pickle")  # a batch that cannot be read is logged and skipped
        + encode_batch([served(i) for i in range(3, 5)])
        + encode_batch([served(5)])[:-3]  # the writer died in the middle of a frame
    )
    reports = io.BytesIO()
    assert serve(backlog, frames, reports, report_every_s=0.01)
    assert [s.job_id for s in backlog.written] == [f"job-{i}" for i in range(5)]
    last = json.loads(reports.getvalue().splitlines()[-1])
    assert last == {"recorded": 5, "retried": 0, "dropped": 0, "cpu_s": backlog.stats().cpu_s}
    assert backlog.stats().queue_depth == 0
