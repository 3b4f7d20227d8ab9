"""The trace record, the payload policy, the tracer and the sink, with an in-memory store."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from dataclasses import replace

import pytest

from examlops.core.backoff import Backoff
from examlops.core.errors import DeadlineExceeded, InferenceFailed, InvalidInput, PipelineUnavailable, StoreUnavailable
from examlops.tracing import PayloadPolicy, Pruned, TraceQuery, Tracer, TraceRecord, TraceSink, outcome_of
from examlops.tracing.record import trace_id_for_job, valid_trace_id


class InMemoryTraceStore:
    def __init__(self, *, down: int = 0, gate: threading.Event | None = None) -> None:
        self.rows: dict[str, TraceRecord] = {}
        self.batches: list[int] = []
        self.down = down
        self.gate = gate

    def add(self, records: Sequence[TraceRecord]) -> int:
        if self.gate is not None:
            self.gate.wait(5)
        if self.down:
            self.down -= 1
            raise StoreUnavailable("down")
        self.batches.append(len(records))
        fresh = [r for r in records if r.trace_id not in self.rows]
        self.rows.update((r.trace_id, r) for r in fresh)
        return len(fresh)

    def get(self, trace_id: str) -> TraceRecord | None:
        return self.rows.get(trace_id)

    def find(self, query: TraceQuery) -> list[TraceRecord]:
        return list(self.rows.values())

    def count(self, query: TraceQuery) -> int:
        return len(self.rows)

    def close(self) -> None:
        pass

    def prune(self, now: float, *, payload_max_age_s: float, row_max_age_s: float) -> Pruned:
        return Pruned(0, 0)


def test_outcome_is_a_property_of_the_error_not_of_a_status() -> None:
    assert outcome_of(None) == "answered"
    assert outcome_of(InvalidInput("x")) == "refused"
    assert outcome_of(DeadlineExceeded("x")) == "refused"
    assert outcome_of(InferenceFailed("x")) == "failed"
    assert outcome_of(PipelineUnavailable("x")) == "failed"
    assert outcome_of(RuntimeError("x")) == "failed"
    assert [outcome_of(c) for c in ("model_not_found", "inference_failed", "http_502")] == [
        "refused",
        "failed",
        "failed",
    ]


def test_a_bus_jobs_trace_id_is_the_same_everywhere_and_valid() -> None:
    assert trace_id_for_job("job-1") == trace_id_for_job("job-1") != trace_id_for_job("job-2")
    assert valid_trace_id(trace_id_for_job("job-1"))
    assert not valid_trace_id("../etc") and not valid_trace_id(None)


def test_payload_policy_keeps_nothing_a_hash_of_canonical_json_or_the_json() -> None:
    assert PayloadPolicy("none").kept_body(b'{"b":1,"a":2}') == ""
    expected = "sha256:" + hashlib.sha256(b'{"a":2,"b":1}').hexdigest()
    assert PayloadPolicy("hash").kept_body(b'{"b": 1, "a": 2}') == expected
    assert PayloadPolicy("full").kept_body(b'{"b": 1, "a": 2}') == '{"a":2,"b":1}'
    assert PayloadPolicy("full").kept_body(b"not json") == '"not json"'


class ListQueue:
    """A trace queue that keeps every record put in it."""

    def __init__(self) -> None:
        self.records: list[TraceRecord] = []

    def put(self, record: TraceRecord) -> bool:
        self.records.append(record)
        return True

    def start(self) -> None: ...

    def close(self, timeout_s: float = 10.0) -> None: ...


def test_tracer_keeps_a_given_valid_id_and_records_each_call_once() -> None:
    queue = ListQueue()
    queued = queue.records
    tracer = Tracer(queue, PayloadPolicy("hash"), node="n1")
    given = trace_id_for_job("j")
    call = tracer.begin("bus", given)
    assert call.trace_id == given
    assert tracer.begin("http", "forged<>").trace_id != "forged<>"
    call.model, call.facts.batch_id, call.facts.batch_size = "JPCP", "b1", 3
    tracer.finish(call, error_code="inference_failed", status=500, input=b"{}")
    tracer.finish(call, error_code=None)
    assert len(queued) == 1
    record = queued[0]
    assert (record.channel, record.outcome, record.error_code, record.node) == (
        "bus",
        "failed",
        "inference_failed",
        "n1",
    )
    assert (record.batch_id, record.batch_size, record.identity, record.task) == ("b1", 3, None, None)
    assert record.input.startswith("sha256:")


def record(n: int) -> TraceRecord:
    return TraceRecord(trace_id=f"{n:032x}", at=1.0, channel="http", outcome="answered")


def test_sink_writes_in_batches_and_drops_and_counts_past_its_bound_without_blocking() -> None:
    gate = threading.Event()
    store = InMemoryTraceStore(gate=gate)
    sink = TraceSink(store, bound=5, batch=100, linger_s=0.05)
    sink.start()
    accepted = [sink.put(record(i)) for i in range(20)]  # the writer is held at the gate: the queue fills
    gate.set()
    assert sink.flush(5)
    sink.close()
    stats = sink.stats()
    assert accepted.count(False) == stats.dropped > 0
    assert stats.written == len(store.rows) == accepted.count(True)
    assert not sink.put(record(99))  # closed: dropped, counted
    assert sink.stats().dropped == stats.dropped + 1


def test_sink_retries_a_batch_while_the_store_is_down_and_loses_nothing_taken() -> None:
    store = InMemoryTraceStore(down=2)
    sink = TraceSink(store, bound=100, batch=10, linger_s=0.0, backoff=Backoff(0.001, 0.002))
    sink.start()
    for i in range(3):
        sink.put(record(i))
    assert sink.flush(5)
    sink.close()
    assert len(store.rows) == 3 and sink.stats().retried == 2 and sink.stats().dropped == 0


def test_a_bound_below_the_batch_never_drops_traces_while_the_writer_lingers() -> None:
    store = InMemoryTraceStore()
    sink = TraceSink(store, bound=10, batch=100, linger_s=30.0)
    sink.start()
    began = time.monotonic()
    for i in range(40):  # the writer takes what waits whenever half the bound does, not at 100
        sink.put(record(i))
        time.sleep(0.02)  # 100 ms for the writer to take five before the bound is reached
    sink.close(5)
    assert time.monotonic() - began < 5
    assert len(store.rows) == 40 and sink.stats().dropped == 0


class RefusingTraceStore(InMemoryTraceStore):
    """Refuses, as Postgres refuses a NUL in a text, every batch holding a record of model ``refused``."""

    def __init__(self) -> None:
        super().__init__()
        self.refusals = 0

    def add(self, records: Sequence[TraceRecord]) -> int:
        if any(r.model == "refused" for r in records):
            self.refusals += 1
            raise ValueError("A string literal cannot contain NUL (0x00) characters.")
        return super().add(records)


def test_a_record_the_store_refuses_drops_itself_only_and_a_store_refusing_all_is_not_asked_per_record() -> None:
    store = RefusingTraceStore()
    sink = TraceSink(store, bound=5_000, batch=2048, linger_s=30.0)
    sink.start()
    for i in range(2048):
        sink.put(replace(record(i), model="refused") if i in (100, 1500) else record(i))
    assert sink.flush(10)
    assert len(store.rows) == 2046 and sink.stats().written == 2046 and sink.stats().dropped == 2
    assert record(100).trace_id not in store.rows and record(1500).trace_id not in store.rows
    assert store.refusals <= 24

    refusing_all = RefusingTraceStore()
    sink = TraceSink(refusing_all, bound=5_000, batch=2048, linger_s=30.0)
    sink.start()
    for i in range(2048):
        sink.put(replace(record(i), model="refused"))
    sink.close(10)
    assert sink.stats().dropped == 2048 and not refusing_all.rows
    assert refusing_all.refusals <= 24 + 11  # the budget, then a last try of each half already split (11 deep)


@pytest.mark.parametrize("refused", [{100, 1000, 1900}, set(range(7, 2048, 200))])
def test_sparse_refused_records_in_a_full_batch_cost_only_themselves(refused: set[int]) -> None:
    store = RefusingTraceStore()
    sink = TraceSink(store, bound=5_000, batch=2048, linger_s=30.0)
    sink.start()
    for i in range(2048):
        sink.put(replace(record(i), model="refused") if i in refused else record(i))
    assert sink.flush(10)
    sink.close(10)
    assert sink.stats().dropped == len(refused) and sink.stats().written == 2048 - len(refused)


class RefusedThenDown(InMemoryTraceStore):
    """Refuses batches of more than 4 records as bad data; then goes down, and the writer is stopped."""

    def __init__(self, stop: threading.Event) -> None:
        super().__init__()
        self.calls = 0
        self.calls_at_stop = 0
        self.stop = stop

    def add(self, records: Sequence[TraceRecord]) -> int:
        self.calls += 1
        if len(records) > 4 and not self.stop.is_set():
            raise ValueError("refused")
        if not self.stop.is_set():
            self.calls_at_stop = self.calls
            self.stop.set()
        raise StoreUnavailable("down")


def test_a_writer_stopped_in_an_outage_during_a_split_drops_the_rest_without_asking_the_store() -> None:
    sink = TraceSink(InMemoryTraceStore(), bound=5_000, batch=2048, backoff=Backoff(0.01, 0.01))
    sink.store = store = RefusedThenDown(sink._stop)
    sink._busy = True
    sink._write([record(i) for i in range(2048)])
    assert sink.dropped == 2048 and sink.written == 0
    assert store.calls == store.calls_at_stop


def test_sink_writes_a_full_batch_without_waiting_out_its_linger_and_close_ends_a_linger() -> None:
    store = InMemoryTraceStore()
    sink = TraceSink(store, bound=100, batch=4, linger_s=30.0)
    sink.start()
    began = time.monotonic()
    for i in range(4):  # the first wakes the idle writer, the fourth fills the batch it lingers on
        sink.put(record(i))
    assert sink.flush(5) and store.batches == [4]
    assert time.monotonic() - began < 5
    sink.put(record(4))  # a batch of one, lingering for 30 s: close writes it now
    sink.close(5)
    assert time.monotonic() - began < 4
    assert len(store.rows) == 5 and sink.stats().dropped == 0


def test_a_finished_call_puts_each_of_its_facts_in_its_own_field() -> None:
    """``Tracer`` builds the record positionally (it is on the request path): every field lands by name."""
    queue = ListQueue()
    queued = queue.records
    ticks = iter([10.0, 10.25])
    tracer = Tracer(queue, PayloadPolicy("full"), node="n9", wall=lambda: 1000.0, clock=lambda: next(ticks))
    call = tracer.begin("bus", trace_id_for_job("j7"))
    call.model, call.adapter, call.identity, call.task, call.job_id = "M", "ad", "who", "t.x", "j7"
    call.budget_ms, call.deadline = 80.0, 1000.05
    facts = call.facts
    facts.alias, facts.version, facts.batch_id, facts.batch_size = "Production", "4", "b-2", 6
    facts.queue_wait_ms, facts.predict_ms = 1.5, 2.5
    tracer.finish(call, error_code="deadline_exceeded", status=504, input=b'{"a":1}', output=b'{"b":2}', verdict=True)
    expected = TraceRecord(
        trace_id=trace_id_for_job("j7"),
        at=1000.0,
        channel="bus",
        outcome="refused",
        error_code="deadline_exceeded",
        model="M",
        alias="Production",
        version="4",
        adapter="ad",
        identity="who",
        task="t.x",
        budget_ms=80.0,
        budget_remaining_ms=50.0,
        used_ms=250.0,
        node="n9",
        batch_id="b-2",
        batch_size=6,
        queue_wait_ms=1.5,
        predict_ms=2.5,
        status=504,
        job_id="j7",
        input=PayloadPolicy("full").kept_body(b'{"a":1}'),
        output=PayloadPolicy("full").kept_body(b'{"b":2}'),
        verdict=True,
    )
    assert queued == [expected]
