"""A trace records the call's budget and what was left of it when the call ended."""

from __future__ import annotations

from examlops.tracing import Tracer
from examlops.tracing.record import TraceRecord


class ListQueue:
    def __init__(self) -> None:
        self.records: list[TraceRecord] = []

    def start(self) -> None: ...

    def close(self, timeout_s: float = 10.0) -> None: ...

    def put(self, record: TraceRecord) -> None:
        self.records.append(record)


def test_the_trace_records_the_budget_and_what_was_left_of_it() -> None:
    now = [1000.0]
    queue = ListQueue()
    tracer = Tracer(queue, wall=lambda: now[0], clock=lambda: now[0])  # type: ignore[arg-type]
    call = tracer.begin("http")
    call.budget_ms, call.deadline = 200.0, 1000.2
    now[0] = 1000.15
    tracer.finish(call, error_code=None, status=200)
    unbudgeted = tracer.begin("http")
    tracer.finish(unbudgeted, error_code=None, status=200)
    first, second = queue.records
    assert (first.budget_ms, first.budget_remaining_ms) == (200.0, 50.0)
    assert (second.budget_ms, second.budget_remaining_ms) == (None, None)
