"""The recorder's loop with fakes at its ports: an in-memory records stream and a collecting sink."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from examlops.core.errors import StoreUnavailable
from examlops.core.records import ServedInference
from examlops.monitoring.recording import Recorder
from examlops.monitoring.recording.stream import Read
from tests.unit.monitoring.fakes import Clock


def served(n: int) -> ServedInference:
    reply = {"prediction": 0.5, "error": None}
    return ServedInference(f"job-{n}", "addr", "JPCP", "u", 3, reply, 200, 1.0, 1.0, 0.5, 0.1, f"{n}-0")


@dataclass
class InMemoryRecordStream:
    """The records stream and its group: entries, who holds which (and since when), the once keys set."""

    clock: Clock
    entries: dict[str, ServedInference | None] = field(default_factory=dict)
    delivered: dict[str, tuple[str, float]] = field(default_factory=dict)
    written: set[str] = field(default_factory=set)
    settled: list[str] = field(default_factory=list)
    down: int = 0
    """Calls that fail with StoreUnavailable before the stream answers again."""

    def add(self, *records: ServedInference) -> None:
        for record in records:
            self.entries[record.entry_id] = record

    def _call(self) -> None:
        if self.down:
            self.down -= 1
            raise StoreUnavailable("Redis cannot be reached (test)")

    def ensure_group(self) -> None:
        self._call()

    def read(self, consumer: str, count: int, block_ms: int | None, *, own: bool = False) -> Read:
        self._call()
        if own:
            ids = [i for i, (holder, _) in self.delivered.items() if holder == consumer]
        else:
            ids = [i for i in self.entries if i not in self.delivered]
        ids = sorted(ids, key=lambda i: int(i.split("-")[0]))[:count]
        for entry_id in ids:
            self.delivered[entry_id] = (consumer, self.clock())
        return [(entry_id, self.entries[entry_id]) for entry_id in ids]

    def claim(self, consumer: str, min_idle_s: float, count: int) -> Read:
        self._call()
        idle = [i for i, (_, at) in self.delivered.items() if self.clock() - at >= min_idle_s][:count]
        for entry_id in idle:
            self.delivered[entry_id] = (consumer, self.clock())
        return [(entry_id, self.entries[entry_id]) for entry_id in idle]

    def written_among(self, entry_ids: Sequence[str]) -> set[str]:
        self._call()
        return set(entry_ids) & self.written

    def settle(self, entry_ids: Sequence[str]) -> None:
        self._call()
        for entry_id in entry_ids:
            self.entries.pop(entry_id, None)
            self.delivered.pop(entry_id, None)
            self.written.discard(entry_id)
            self.settled.append(entry_id)

    def dropped(self) -> int:
        return 0

    def prune(self, consumer: str) -> int:
        return 0


@dataclass
class CollectingSink:
    """Writes into a list; once keys are the stream's ``written`` set, as the audit script sets them."""

    stream: InMemoryRecordStream
    batches: list[list[str]] = field(default_factory=list)
    fail_with: Exception | None = None
    closed: bool = False

    def write(self, records: Sequence[ServedInference]) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        fresh = [r.entry_id for r in records if r.entry_id not in self.stream.written]
        self.stream.written.update(fresh)
        self.batches.append(fresh)

    def idle(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    @property
    def ids(self) -> list[str]:
        return [entry_id for batch in self.batches for entry_id in batch]


def recorder(stream: InMemoryRecordStream, sink: CollectingSink, consumer: str = "me", **options: float) -> Recorder:
    return Recorder(stream, sink, consumer, batch=4, linger_s=0, reclaim_idle_s=60, clock=stream.clock, **options)  # type: ignore[arg-type]  # batch and friends


@pytest.fixture
def stream() -> InMemoryRecordStream:
    return InMemoryRecordStream(Clock())


def test_records_are_written_in_batches_and_settled(stream: InMemoryRecordStream) -> None:
    sink = CollectingSink(stream)
    stream.add(*[served(n) for n in range(10)])
    rec = recorder(stream, sink)
    while rec.step(None, None):
        pass
    assert [len(b) for b in sink.batches] == [4, 4, 2]
    assert sink.ids == [f"{n}-0" for n in range(10)] and stream.settled == sink.ids
    assert not stream.entries and rec.stats().recorded == 10


def test_a_consumer_reads_what_its_previous_run_left_unsettled_first(stream: InMemoryRecordStream) -> None:
    stream.add(*[served(n) for n in range(6)])
    stream.read("me", 2, None)  # the previous run of "me" read two, then died
    sink = CollectingSink(stream)
    rec = recorder(stream, sink)
    rec.step(None, None)
    assert sink.batches == [["0-0", "1-0"]]
    while rec.step(None, None):
        pass
    assert sorted(sink.ids) == [f"{n}-0" for n in range(6)]


def test_a_dead_recorders_records_are_reclaimed_and_those_it_wrote_are_not_written_twice(
    stream: InMemoryRecordStream,
) -> None:
    stream.add(*[served(n) for n in range(8)])
    dead_sink = CollectingSink(stream)
    dead = recorder(stream, dead_sink, "dead")
    read = stream.read("dead", 4, None)
    dead_sink.write([r for _, r in read if r is not None])  # written, then it died before settling
    stream.read("dead", 2, None)  # read and never written
    sink = CollectingSink(stream)
    rec = recorder(stream, sink, "alive")
    rec.step(None, None)  # the two nobody held
    assert sink.ids == ["6-0", "7-0"]
    stream.clock.advance(61)
    while rec.step(None, None):
        pass
    assert sink.ids == ["6-0", "7-0", "4-0", "5-0"], "written ones settled without a second write"
    assert sorted(dead_sink.ids + sink.ids) == sorted(f"{n}-0" for n in range(8))
    assert not stream.entries and (rec.stats().reclaimed, rec.stats().recorded) == (6, 8), "found written count"
    assert dead.stats().recorded == 0


def test_an_outage_is_waited_out_and_the_batch_written_once(stream: InMemoryRecordStream) -> None:
    stream.add(*[served(n) for n in range(3)])
    sink = CollectingSink(stream)
    rec = recorder(stream, sink)
    stop = threading.Event()
    stream.down = 3
    done = rec._retried(lambda: rec.step(None, None), stop)
    assert done == 3 and rec.stats().retried == 3 and sink.ids == ["0-0", "1-0", "2-0"]


def test_a_batch_interrupted_by_an_outage_is_written_again_whole_before_anything_new(
    stream: InMemoryRecordStream,
) -> None:
    stream.add(*[served(n) for n in range(6)])
    sink = CollectingSink(stream, fail_with=StoreUnavailable("lost while writing"))
    rec = recorder(stream, sink)
    stop = threading.Event()
    with pytest.raises(StoreUnavailable):
        rec.step(None, None)
    sink.fail_with = None
    assert rec._retried(lambda: rec.step(None, None), stop) == 4
    assert sink.batches == [["0-0", "1-0", "2-0", "3-0"]] and stream.settled == ["0-0", "1-0", "2-0", "3-0"]


def test_a_batch_the_sink_refuses_is_settled_as_dropped_so_the_stream_moves_on(
    stream: InMemoryRecordStream, caplog: pytest.LogCaptureFixture
) -> None:
    stream.add(served(1), served(2))
    stream.entries["3-0"] = None  # an entry that is not a record
    sink = CollectingSink(stream, fail_with=RuntimeError("refused"))
    rec = recorder(stream, sink)
    rec.step(None, None)
    assert not stream.entries and rec.stats().dropped == 3 and rec.stats().recorded == 0
    assert "could not be written" in caplog.text and "cannot be read" in caplog.text


def test_run_drains_what_is_left_when_stopped_and_closes_the_sink(stream: InMemoryRecordStream) -> None:
    stream.add(*[served(n) for n in range(9)])
    sink = CollectingSink(stream)
    rec = recorder(stream, sink)
    stop = threading.Event()
    stop.set()
    rec.run(stop)
    assert len(sink.ids) == 9 and sink.closed
