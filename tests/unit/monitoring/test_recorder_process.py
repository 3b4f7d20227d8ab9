"""The recording process's frames and its loop, without a process or Redis: a collecting backlog stands in
for the Redis writer."""

from __future__ import annotations

import dataclasses
import io
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from examlops.core.records import ServedInference
from examlops.monitoring.recorder import Backlog, Served, Tuning, _row
from examlops.monitoring.recorder_process import (
    HEADER,
    MAX_FRAME,
    Hello,
    RecorderProcess,
    control,
    decode_batch,
    encode_batch,
    frame,
    read_frame,
    read_hello,
    serve,
)
from examlops.monitoring.snapshots import embedding_stats


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
        super().__init__(Tuning(linger_s=0))
        self.written: list[Served] = []

    def _write(self, batch: Sequence[Served]) -> None:
        self.written += batch
        self.recorded += len(batch)


def test_a_batch_crosses_the_pipe_with_the_embedding_statistics_in_place_of_the_embedding() -> None:
    batch = [served(1), served(2, (3.0, 4.0)), served(3, ())]
    got = read_frame(io.BytesIO(encode_batch(batch)))
    assert got is not None and got[0] == 3
    shipped = decode_batch(got[1])
    assert [s.job_id for s in shipped] == ["job-1", "job-2", "job-3"]
    assert [s.embedding_stats for s in shipped] == [embedding_stats(s.embedding) for s in batch]
    assert shipped[1].embedding_stats[0] == 5.0 and shipped[2].embedding_stats == (0.0, 0.0, 0.0)
    assert all(s.embedding == () for s in shipped)
    assert [(s.reply, s.status, s.served_at, s.node_count) for s in shipped] == [
        (dict(s.reply), s.status, s.served_at, s.node_count) for s in batch
    ]


def test_a_shipped_record_makes_the_same_snapshot_and_event_as_the_served_one() -> None:
    original = served(7, (0.1, 0.2, -0.3, 0.9))
    got = read_frame(io.BytesIO(encode_batch([original])))
    assert got is not None
    assert _row(decode_batch(got[1])[0]) == _row(original)


def test_a_frame_cut_short_reads_as_the_end_and_a_huge_one_is_refused() -> None:
    whole = encode_batch([served(1)])
    assert read_frame(io.BytesIO(b"")) is None
    assert read_frame(io.BytesIO(whole[:2])) is None
    assert read_frame(io.BytesIO(whole[:-1])) is None
    with pytest.raises(ValueError, match="out of step"):
        read_frame(io.BytesIO(HEADER.pack(MAX_FRAME + 1, 1)))
    hello = Hello("{}", Tuning(maxsize=10, batch_size=5), 19)
    assert read_hello(io.BytesIO(hello.encode())) == hello
    assert read_hello(io.BytesIO(b"")) is None
    with pytest.raises(ValueError, match="hello"):
        read_hello(io.BytesIO(whole))


def test_serve_records_every_frame_until_eof_then_closes_and_reports_its_totals() -> None:
    backlog = Collecting()
    backlog.start()
    frames = io.BytesIO(
        encode_batch([served(i) for i in range(3)])
        + frame(b"not a pickle", 4)  # a batch that cannot be read: its 4 records are counted as dropped
        + control({"close_s": 5.0})
        + encode_batch([served(i) for i in range(3, 5)])
        + encode_batch([served(5)])[:-3]  # the writer died in the middle of a frame
    )
    reports = io.BytesIO()
    assert serve(backlog, frames, reports, report_every_s=0.01)
    assert [s.job_id for s in backlog.written] == [f"job-{i}" for i in range(5)]
    lines = reports.getvalue().splitlines()
    assert json.loads(lines[0]) == {"recorded": 0, "retried": 0, "dropped": 0, "cpu_s": 0.0}, "ready at once"
    assert json.loads(lines[-1]) == {"recorded": 5, "retried": 0, "dropped": 4, "cpu_s": backlog.stats().cpu_s}
    assert backlog.stats().queue_depth == 0


# RecorderProcess with stand-in children: this script plays the child, one mode per start (``modes``), and
# writes what it recorded to ``written``.
CHILD = r"""
import sys, time
from pathlib import Path

state = Path(sys.argv[1])
starts = state / "starts"
n = int(starts.read_text()) if starts.exists() else 0
(state / "starts.new").write_text(str(n + 1))
(state / "starts.new").replace(starts)  # whole, for a reader in the test
modes = (state / "modes").read_text().split(",")
mode = modes[min(n, len(modes) - 1)]
if mode == "exit":
    sys.exit(5)

from examlops.monitoring.recorder import Backlog
from examlops.monitoring.recorder_process import read_hello, serve

hello = read_hello(sys.stdin.buffer)
out = sys.stdout.buffer
if mode in ("die-mid-frame", "stuck"):
    out.write(b'{"recorded": 0, "retried": 0, "dropped": 0, "cpu_s": 0.0}\n')
    out.flush()
    if mode == "stuck":
        time.sleep(60)
    sys.stdin.buffer.read(100)
    sys.exit(3)


class Keep(Backlog):
    def _write(self, batch):
        with open(state / "written", "a") as f:
            f.writelines(s.job_id + "\n" for s in batch)
        self.recorded += len(batch)


serve(Keep(hello.tuning).start(), sys.stdin.buffer, out, report_every_s=0.02)
"""


def stand_in(tmp_path: Path, modes: str, *, maxsize: int = 10_000, **options: float) -> RecorderProcess:
    (tmp_path / "modes").write_text(modes)
    argv = [sys.executable, "-c", CHILD, str(tmp_path)]
    tuning = Tuning(maxsize=maxsize, linger_s=0.01)
    return RecorderProcess(argv, "{}", tuning, nice=0, restart_s=0.05, **options).start()


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def big(job: int) -> ServedInference:
    return dataclasses.replace(served(job), reply={"prediction": 0.5, "detail": f"{job:04d}" + "x" * 2000})


def written(tmp_path: Path) -> list[str]:
    path = tmp_path / "written"
    return path.read_text().split() if path.exists() else []


def test_a_frame_whose_child_died_while_it_was_written_is_shipped_again_to_the_next(tmp_path: Path) -> None:
    recorder = stand_in(tmp_path, "die-mid-frame,serve")
    try:
        recorder.record([big(i) for i in range(100)])  # ~200 KB: more than the pipe holds
        assert recorder.close(20)
    finally:
        recorder.close(1)
    stats = recorder.stats()
    assert (stats.recorded, stats.dropped, stats.queue_depth, recorder.restarts) == (100, 0, 0, 1)
    assert sorted(written(tmp_path)) == sorted(f"job-{i}" for i in range(100))


def test_a_child_that_cannot_start_is_tried_again_with_a_growing_delay_and_gets_no_records(
    tmp_path: Path,
) -> None:
    recorder = stand_in(tmp_path, "exit", max_restart_s=0.4)
    try:
        recorder.record([served(i) for i in range(10)])
        time.sleep(1.5)
        starts = int((tmp_path / "starts").read_text())
        # Delays of 0.05, 0.1, 0.2, then 0.4 s: a 7th start cannot come before 1.55 s. A fixed 0.05 s
        # would start ~20 in that time.
        assert 2 <= starts <= 7
        stats = recorder.stats()
        assert (stats.recorded, stats.dropped, stats.queue_depth) == (0, 0, 10), "they wait in the bridge"
        assert not recorder.close(0.5)
    finally:
        recorder.close(1)
    assert (recorder.stats().dropped, recorder.stats().queue_depth) == (10, 0)


def test_the_bridge_ships_no_more_than_its_bound_to_a_child_that_does_not_keep_up(tmp_path: Path) -> None:
    recorder = stand_in(tmp_path, "stuck", maxsize=20)
    try:
        wait_for(lambda: recorder.connected, "the child's first report")
        recorder.record([served(i) for i in range(20)])
        wait_for(lambda: recorder.held() == 20, "20 records shipped")
        recorder.record([served(i) for i in range(20, 120)])
        time.sleep(0.2)
        stats = recorder.stats()
        assert recorder.held() == 20, "no more than the bound goes to the child"
        # The bridge keeps its queue (20) and a batch in hand (at most 20); the rest is dropped and counted.
        assert stats.dropped >= 60
        assert stats.queue_depth + stats.dropped == 120
        assert not recorder.close(0.5)
    finally:
        recorder.close(1)
    stats = recorder.stats()
    assert (stats.recorded, stats.dropped, stats.queue_depth) == (0, 120, 0)


def test_a_child_that_goes_silent_is_stopped_and_its_records_counted_then_another_takes_over(
    tmp_path: Path,
) -> None:
    recorder = stand_in(tmp_path, "stuck,serve", silence_s=0.5)
    try:
        wait_for(lambda: recorder.connected, "the child's first report")
        stuck = recorder.pid
        recorder.record([served(i) for i in range(5)])
        wait_for(lambda: recorder.stats().dropped == 5, "the stuck child stopped")
        wait_for(lambda: recorder.connected and recorder.pid != stuck, "the next child")
        recorder.record([served(i) for i in range(5, 8)])
        assert recorder.close(10)
    finally:
        recorder.close(1)
    assert (recorder.stats().recorded, recorder.stats().dropped, recorder.restarts) == (3, 5, 1)
    assert written(tmp_path) == ["job-5", "job-6", "job-7"]


class Failing(Collecting):
    def _write(self, batch: Sequence[Served]) -> None:
        raise RuntimeError("not an outage: a bug, a full disk")


def test_a_batch_whose_write_fails_for_another_reason_than_an_outage_is_counted_as_dropped() -> None:
    backlog = Failing()
    backlog.start()
    backlog.record([served(i) for i in range(4)])
    assert backlog.close(5)
    stats = backlog.stats()
    assert (stats.recorded, stats.dropped, stats.queue_depth) == (0, 4, 0)


def test_a_record_that_cannot_be_shipped_is_dropped_and_the_rest_of_its_batch_goes(tmp_path: Path) -> None:
    recorder = stand_in(tmp_path, "serve")
    try:
        unshippable = dataclasses.replace(served(1), reply={"prediction": 0.5, "why": lambda: None})
        recorder.record([served(0), unshippable, served(2)])
        assert recorder.close(10)
    finally:
        recorder.close(1)
    assert (recorder.stats().recorded, recorder.stats().dropped) == (2, 1)
    assert written(tmp_path) == ["job-0", "job-2"]
