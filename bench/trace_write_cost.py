"""The CPU a trace costs in each place it is handled, in one process, without servers (issue 16).

- ``sql``: CPU per row of ``SqlTraceStore.add`` in batches of ``--batch`` into a fresh SQLite trace table
  already holding ``--prefill`` rows, the ids made by the checkout's own ``new_trace_id`` (what the
  serving process's writer child does per batch);
- ``sink``: a ``Tracer`` over a ``TraceSink`` whose store turns each batch into tuples and pickles them (as
  ``ChildTraceStore`` does before its pipe), fed ``--calls`` calls at about ``--rate`` a second: the CPU
  per call of the calling thread (its pacing sleeps included) and of the sink's writer thread (psutil).

Run it with ``PYTHONPATH`` on the checkout to measure (the editable install otherwise wins), and compare
checkouts run one after the other, as ratios:

    PYTHONPATH=. .venv/bin/python bench/trace_write_cost.py [--rounds 3] [--prefill 100000] [--batch 256]

Figures only: nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import operator
import os
import pickle
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

import psutil

from examlops.bootstrap.sql import sql_engine, upgrade_database
from examlops.core.settings import Settings
from examlops.tracing import PayloadPolicy, Pruned, Tracer, TraceRecord, TraceSink, new_trace_id
from examlops.tracing.sql_store import SqlTraceStore

_fields_of = operator.attrgetter(*(f.name for f in fields(TraceRecord)))


def records(n: int) -> list[TraceRecord]:
    now = time.time()
    return [
        TraceRecord(
            new_trace_id(),
            now + i * 1e-4,
            "http",
            "answered",
            model="JPCP",
            alias="prod",
            version="1",
            identity="admin",
            used_ms=3.2,
            node="bench",
            batch_id=os.urandom(8).hex(),
            batch_size=12,
            queue_wait_ms=1.0,
            predict_ms=0.5,
            status=200,
        )
        for i in range(n)
    ]


def sql_cost(home: Path, prefill: int, batch: int, rounds: int) -> list[float]:
    settings = Settings(home=home)
    upgrade_database(settings)
    engine = sql_engine(settings)
    try:
        store = SqlTraceStore(engine)
        for chunk in _chunks(records(prefill), batch):
            store.add(chunk)
        spent = []
        for _ in range(rounds):
            written = records(100 * batch)
            began = time.process_time()
            for chunk in _chunks(written, batch):
                store.add(chunk)
            spent.append(1e6 * (time.process_time() - began) / len(written))
        return spent
    finally:
        engine.dispose()


def _chunks(rows: list[TraceRecord], size: int) -> list[list[TraceRecord]]:
    return [rows[i : i + size] for i in range(0, len(rows), size)]


class PicklingStore:
    """What ``ChildTraceStore`` does with a batch before its pipe: tuples, pickled."""

    def add(self, batch: Sequence[TraceRecord]) -> int:
        pickle.dumps(("add", [_fields_of(record) for record in batch]))
        return len(batch)

    def prune(self, now: float, *, payload_max_age_s: float, row_max_age_s: float) -> Pruned:
        return Pruned(0, 0)

    def close(self) -> None:
        pass


def sink_cost(calls: int, rate: float) -> tuple[float, float]:
    sink = TraceSink(PicklingStore(), bound=calls + 1)  # type: ignore[arg-type]  # the store's write side only
    sink.start()
    tracer = Tracer(sink, PayloadPolicy("none"), node="bench")
    me = threading.main_thread().native_id
    before = {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}
    began = time.thread_time()
    every = max(1, int(rate / 100))  # pace in steps of 10 ms
    for i in range(calls):
        call = tracer.begin("http")
        call.model, call.identity = "JPCP", "admin"
        tracer.finish(call, error_code=None, status=200)
        if i % every == 0:
            time.sleep(every / rate)
    caller = time.thread_time() - began
    sink.flush(30)
    after = {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}
    sink.close()
    writer = sum(spent - before.get(tid, 0.0) for tid, spent in after.items() if tid != me)
    return 1e6 * caller / calls, 1e6 * writer / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefill", type=int, default=100_000, help="Rows in the table before measuring.")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--calls", type=int, default=30_000)
    parser.add_argument("--rate", type=float, default=3000.0, help="Calls a second fed to the sink.")
    args = parser.parse_args()
    import examlops

    print(f"checkout: {Path(examlops.__file__).parent.parent}")
    with tempfile.TemporaryDirectory(prefix="trace-write-cost-") as home:
        rows = sql_cost(Path(home), args.prefill, args.batch, args.rounds)
    print(f"sql: CPU per row {' / '.join(f'{x:.1f}' for x in rows)} µs (batches of {args.batch})")
    caller, writer = sink_cost(args.calls, args.rate)
    print(f"sink: calling thread {caller:.1f} µs per call (pacing included), writer thread {writer:.1f} µs")


if __name__ == "__main__":
    main()
