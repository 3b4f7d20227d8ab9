"""TraceSink's split of a refused batch: sparse refusals cost only themselves, stop ends a split in an outage."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace

import pytest

from examlops.core.backoff import Backoff
from examlops.core.errors import StoreUnavailable
from examlops.tracing import TraceRecord, TraceSink
from tests.unit.tracing.test_tracing import InMemoryTraceStore, RefusingTraceStore, record


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
