"""``TraceSink``: takes traces on the request path without waiting, writes them to the store in batches.

Contract:

- ``put(record)`` never blocks and never raises: the record joins a bounded in-memory queue, or, when
  ``bound`` records are waiting already (the store is slow or down) or the sink is closed, it is dropped
  and counted (``dropped``; ``examlops_traces_dropped_total`` on the registry given). A request is never
  slowed or failed by tracing.
- One writer thread takes up to ``batch`` records at a time (lingering ``linger_s`` for more when fewer
  wait, and taking what waits whenever half of ``bound`` does) and hands them to ``TraceStore.add`` in one
  transaction. While the store is unavailable it retries the same batch with backoff (``core.backoff``),
  so nothing already taken is lost to an outage; the queue fills behind it and further traces are
  dropped. A batch that fails otherwise is written again in halves, so a record the store refuses drops
  itself only (logged, counted as dropped); a store that refuses every record is asked at most about
  ``_SPLIT_FAILURES`` + log2(``batch``) times a batch.
- Every ``prune_every_s`` the writer applies the retention (``TraceStore.prune``): rows past
  ``row_max_age_s`` deleted, input and output past ``payload_max_age_s`` cleared. Pruning at write time
  keeps a serving instance that runs without the control plane within its retention too.
- ``close(timeout_s)`` stops taking records, writes what is queued (at most ``timeout_s``) and joins the
  thread; what is left then is counted as dropped.

The queue is a ``collections.deque`` whose length is checked against ``bound``: ``put`` appends (and wakes
the writer only when the queue was empty) and the writer pops, with no lock per record (``queue.Queue``
took two locks and a notify per trace on each side, in serving's GIL: bench/RESULTS.md). Concurrent puts
may overshoot ``bound`` by the number of threads putting at once.

The queue and the writer are the recording machinery's shape (``monitoring.recording``: bounded, batched,
linger, backoff while the store is down, counted drops) kept in process: serving answers HTTP without
Redis, and its traces need not travel through Redis to reach SQL.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from examlops.core.backoff import RECONNECT, Backoff, Outage
from examlops.core.errors import StoreUnavailable
from examlops.tracing.record import TraceRecord
from examlops.tracing.store import TraceStore

log = logging.getLogger(__name__)

_POLL_S = 0.5
"""How long the writer waits for a first record before it looks at its stop flag and the prune clock."""
_SPLIT_FAILURES = 24
"""Failed writes (other than outages) a batch may take, net of the writes that succeed, while it is split to
find the records the store refuses: about half as many refused records a batch are isolated, each costing only
itself; a store that refuses them all spends it and is asked no more."""


@dataclass(frozen=True, slots=True)
class SinkStats:
    queued: int
    """Traces waiting to be written now."""
    written: int
    """Traces handed to the store and committed (a trace id already stored counts too)."""
    dropped: int
    """Traces never written: the queue was full, the sink closed, or a batch failed other than by an outage."""
    retried: int
    """Tries that found the store unavailable."""
    pruned: int
    """Rows the retention deleted."""


class TraceSink:
    """A bounded queue of traces and the thread that writes them (contract above)."""

    def __init__(
        self,
        store: TraceStore,
        *,
        bound: int = 10_000,
        batch: int = 2048,
        linger_s: float = 1.0,
        payload_max_age_s: float = 7 * 86400.0,
        row_max_age_s: float = 30 * 86400.0,
        prune_every_s: float = 300.0,
        registry: CollectorRegistry | None = None,
        wall: Callable[[], float] = time.time,
        backoff: Backoff = RECONNECT,
    ) -> None:
        self.store = store
        self.batch = batch
        self.linger_s = linger_s
        self.payload_max_age_s = payload_max_age_s
        self.row_max_age_s = row_max_age_s
        self.prune_every_s = prune_every_s
        self.wall = wall
        self.written = self.dropped = self.retried = self.pruned = 0
        self.bound = bound
        self._pending: deque[TraceRecord] = deque()
        self._busy = False
        """The writer holds records it took and has not yet written or dropped."""
        self._wake = threading.Event()
        self._want = 1
        """How many waiting records wake the writer: 1 when it is idle, a batch's room while it lingers."""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._outage = Outage("trace writer", log, backoff=backoff, what="the trace store")
        self._next_prune = 0.0
        self._dropped_metric: Counter | None = None
        self._written_metric: Counter | None = None
        if registry is not None:
            self._dropped_metric = Counter(
                "examlops_traces_dropped",
                "Traces not written: queue full, sink closed or write failed",
                registry=registry,
            )
            self._written_metric = Counter("examlops_traces_written", "Traces written to the store", registry=registry)
            queued = Gauge("examlops_traces_queued", "Traces waiting to be written", registry=registry)
            queued.set_function(self._pending.__len__)

    def start(self) -> None:
        """Start the writer thread; idempotent."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="examlops-trace-writer", daemon=True)
            self._thread.start()

    def put(self, record: TraceRecord) -> bool:
        """Queue one trace; False (and counted as dropped) when the queue is full or the sink closed."""
        pending = self._pending
        if self._closed or len(pending) >= self.bound:
            self._drop(1)
            return False
        pending.append(record)
        if len(pending) == self._want:  # the writer waits for a first record, or for a full batch
            self._wake.set()
        return True

    def stats(self) -> SinkStats:
        return SinkStats(len(self._pending), self.written, self.dropped, self.retried, self.pruned)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every trace queued so far is written or dropped; False when ``timeout_s`` passed first."""
        until = time.monotonic() + timeout_s
        while time.monotonic() < until:
            if self._idle():
                return True
            time.sleep(0.01)
        return self._idle()

    def _idle(self) -> bool:
        return not self._pending and not self._busy

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop taking traces, write what is queued (a lingering batch at once) for at most ``timeout_s``, stop
        the writer."""
        self._closed = True
        self._wake.set()  # a lingering writer writes what it holds now: nothing more is coming
        if self._thread is not None:
            self.flush(timeout_s)
            self._stop.set()
            self._wake.set()
            self._thread.join(timeout_s)
        left = self._take_all()
        if left:
            self._drop(len(left))
        self.store.close()
        log.info("trace writer: %d written, %d dropped, %d store retries", self.written, self.dropped, self.retried)

    def _run(self) -> None:
        while not self._stop.is_set():
            batch = self._next_batch()
            if batch:
                self._write(batch)
            if self.wall() >= self._next_prune:
                self._prune()

    def _next_batch(self) -> list[TraceRecord]:
        pending = self._pending
        if not pending:
            self._sleep(1, _POLL_S)
            if not pending:
                return []
        self._busy = True  # before taking: flush never sees the records in neither place
        batch: list[TraceRecord] = []
        until = time.monotonic() + self.linger_s
        while True:
            self._take_waiting(batch)
            wait = until - time.monotonic()
            if len(batch) >= self.batch or wait <= 0 or self._closed:
                return batch
            # Sleep until the batch can be filled or the linger is over, rather than wake for each record or
            # on a short clock: each wake-up takes the GIL from the request path (bench/RESULTS.md). Never
            # for more than half the bound: a queue that cannot hold the batch's room would drop traces
            # while the writer lingers.
            self._sleep(max(1, min(self.batch - len(batch), self.bound // 2)), wait)

    def _sleep(self, want: int, timeout_s: float) -> None:
        """Wait at most ``timeout_s`` for ``want`` records waiting (or ``close``); a put missed by the race
        between two putters is taken when the timeout ends."""
        self._want = want
        self._wake.clear()
        if len(self._pending) < want and not (self._closed and self._busy):  # after the clear: no set is lost
            self._wake.wait(timeout_s)

    def _take_waiting(self, batch: list[TraceRecord]) -> None:
        pending, room = self._pending, self.batch - len(batch)
        while room > 0 and pending:
            batch.append(pending.popleft())
            room -= 1

    def _write(self, batch: list[TraceRecord]) -> None:
        try:
            self._write_or_split(batch, [_SPLIT_FAILURES])
        finally:
            self._busy = False

    def _write_or_split(self, batch: list[TraceRecord], failures: list[int]) -> bool:
        """Write ``batch`` (waiting out an outage); a batch that fails otherwise is written again in halves, so
        that a record the store refuses (a NUL in a text on Postgres, say) costs only itself. A failed write
        spends one of ``_SPLIT_FAILURES`` and a write that succeeds gives one back: a store that refuses every
        record is not asked once per record (once the budget is spent what fails is dropped whole, each half
        already split tried once more), while one that takes the rest isolates about ``_SPLIT_FAILURES`` / 2
        refused records. False when the writer was stopped during an outage: the rest of the batch is then
        dropped without asking the store again."""
        try:
            while True:
                try:
                    self.store.add(batch)
                except StoreUnavailable as exc:
                    self.retried += 1
                    if self._stop.wait(self._outage.lost(exc)):
                        self._drop(len(batch))
                        return False
                    continue
                self._outage.back()
                self.written += len(batch)
                if self._written_metric is not None:
                    self._written_metric.inc(len(batch))
                failures[0] += 1
                return True
        except Exception:
            failures[0] -= 1
            if len(batch) == 1 or failures[0] <= 0:
                log.exception("%d traces could not be written; dropped (the first: %s)", len(batch), batch[0].trace_id)
                self._drop(len(batch))
                return True
        half = len(batch) // 2
        if not self._write_or_split(batch[:half], failures):
            self._drop(len(batch) - half)
            return False
        return self._write_or_split(batch[half:], failures)

    def _prune(self) -> None:
        self._next_prune = self.wall() + self.prune_every_s
        try:
            done = self.store.prune(
                self.wall(), payload_max_age_s=self.payload_max_age_s, row_max_age_s=self.row_max_age_s
            )
        except StoreUnavailable:
            return  # the next write meets the outage and waits it out; pruning comes round again
        except Exception:
            log.exception("pruning the traces failed")
            return
        self.pruned += done.deleted
        if done.deleted or done.cleared:
            log.info("trace retention: %d rows deleted, %d payloads cleared", done.deleted, done.cleared)

    def _take_all(self) -> list[TraceRecord]:
        left: list[TraceRecord] = []
        pending = self._pending
        while pending:
            left.append(pending.popleft())
        return left

    def _drop(self, n: int) -> None:
        with self._lock:  # the request path and the writer both drop
            self.dropped += n
        if self._dropped_metric is not None:
            self._dropped_metric.inc(n)
