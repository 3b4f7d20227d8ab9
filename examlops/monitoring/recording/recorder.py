"""The recorder: drains the records stream into a ``RecordSink``, in batches, as one consumer of ``recorders``.

Contract of ``Recorder.run(stop)``:

- First the records this consumer name read before and never settled (its previous run died), then new
  ones: up to ``batch`` at a time; when fewer came, it lingers ``linger_s`` for more before writing.
- Every ``reclaim_every_s`` it claims records another consumer read and left unsettled for
  ``reclaim_idle_s`` (that recorder died): those whose event was written already (its once key is set)
  are settled without writing; the rest are written like new ones.
- A batch is written (``sink.write``), then settled (acknowledged, deleted, once keys removed). An outage
  in between makes the next step write the same batch again; a crash leaves it pending: whoever claims
  it finds its once keys and writes nothing twice.
- While Redis is unavailable it retries with backoff (``core.backoff.RECONNECT``); nothing is lost, the
  records wait in the stream. A write that fails otherwise (a bug, a refused script) settles the batch as
  dropped, logged, so that one bad batch cannot stall the stream.
- ``stop`` set: it drains what is in the stream now (at most ``drain_s``), calls ``sink.close`` and logs
  its totals with the CPU it spent (``cpu_s``). Unread records stay for the next recorder.
- ``beat`` is called at least once per loop pass (the parent's liveness check).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from examlops.core.backoff import Outage
from examlops.core.errors import StoreUnavailable
from examlops.core.records import RecordSink, ServedInference
from examlops.monitoring.recording.stream import Read, RecordStream

log = logging.getLogger(__name__)

BLOCK_MS = 1000
"""How long one read waits for new records (bounds how long a stop or a heartbeat waits)."""
IDLE_S = 1.0
"""The idle work (due checkpoints, the dropped count, stale consumers) runs at least this often."""


@dataclass(frozen=True, slots=True)
class RecorderStats:
    recorded: int
    """Records settled as written (by this recorder, or found written by a dead one)."""
    reclaimed: int
    """Records claimed from consumers that died."""
    retried: int
    """Tries that found Redis unavailable."""
    dropped: int
    """Records settled unwritten: unreadable entries, or a batch whose write failed other than by an outage."""
    cpu_s: float
    """CPU time the recorder's thread spent reading and writing (not waiting)."""


class Recorder:
    """One consumer of the records stream writing to ``sink``; the module docstring states the contract."""

    def __init__(
        self,
        stream: RecordStream,
        sink: RecordSink,
        consumer: str,
        *,
        batch: int = 256,
        linger_s: float = 0.1,
        reclaim_idle_s: float = 60.0,
        drain_s: float = 10.0,
        beat: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.sink = sink
        self.consumer = consumer
        self.batch = batch
        self.linger_s = linger_s
        self.reclaim_idle_s = reclaim_idle_s
        self.reclaim_every_s = max(1.0, reclaim_idle_s / 4)
        self.drain_s = drain_s
        self.beat = beat
        self.clock = clock
        self.recorded = self.reclaimed = self.retried = self.dropped = 0
        self.cpu_s = 0.0
        self._outage = Outage(f"recorder {consumer}", log)
        self._own_done = False
        self._next_reclaim = 0.0
        self._dropped_seen: int | None = None
        self._unsettled: Read = []

    def stats(self) -> RecorderStats:
        return RecorderStats(self.recorded, self.reclaimed, self.retried, self.dropped, self.cpu_s)

    def run(self, stop: threading.Event) -> None:
        self._retried(self.stream.ensure_group, stop)
        next_idle = self.clock()
        while not stop.is_set():
            self.beat()
            wrote = self._retried(lambda: self.step(BLOCK_MS, stop.wait), stop)
            if not wrote or self.clock() >= next_idle:
                self._idle()
                next_idle = self.clock() + IDLE_S
        self.drain()
        self.sink.close()
        self.log_totals()

    def drain(self) -> None:
        """Write what the stream holds for this consumer now, for at most ``drain_s``."""
        until = self.clock() + self.drain_s
        while self.clock() < until and self._retried(lambda: self.step(None, None), threading.Event(), until):
            self.beat()

    def step(self, block_ms: int | None, linger: Callable[[float], object] | None) -> int:
        """Read one batch (claimed, own pending, or new), write and settle it; how many records it held.

        ``block_ms``: how long a read waits for a first record; ``linger(seconds)`` waits for more when
        fewer than a batch came (None: no wait).
        """
        began = time.thread_time()
        try:
            if self._unsettled:  # a batch an outage interrupted: the same one again, under the same keys
                read = self._unsettled
                self._write(read)
                return len(read)
            claimed = self._claim()
            if claimed:
                return self._settle_claimed(claimed)
            own = not self._own_done
            read = self.stream.read(self.consumer, self.batch, None if own else block_ms, own=own)
            if own and not read:
                self._own_done = True
                return self.step(block_ms, linger)
            if not own and read and len(read) < self.batch and self.linger_s > 0 and linger is not None:
                linger(self.linger_s)
                read += self.stream.read(self.consumer, self.batch - len(read), None)
            self._write(read)
            return len(read)
        finally:
            self.cpu_s += time.thread_time() - began

    def log_totals(self) -> None:
        per_record = 1e6 * self.cpu_s / self.recorded if self.recorded else 0.0
        log.info(
            "recorder: %d recorded, %d reclaimed, %d retries, %d dropped; %.3f s of CPU writing (%.1f us per record)",
            self.recorded, self.reclaimed, self.retried, self.dropped, self.cpu_s, per_record,
        )  # fmt: skip

    def _claim(self) -> Read:
        if self.clock() < self._next_reclaim:
            return []
        self._next_reclaim = self.clock() + self.reclaim_every_s
        claimed = self.stream.claim(self.consumer, self.reclaim_idle_s, self.batch)
        if claimed:
            self.reclaimed += len(claimed)
            log.warning("recorder %s: reclaimed %d records of a recorder that stopped", self.consumer, len(claimed))
        return claimed

    def _settle_claimed(self, claimed: Read) -> int:
        written = self.stream.written_among([entry_id for entry_id, _ in claimed])
        if written:
            self.stream.settle(sorted(written))
            self.recorded += len(written)
        self._write([(entry_id, record) for entry_id, record in claimed if entry_id not in written])
        self._next_reclaim = 0.0  # a dead recorder may have left more: look again at once
        return len(claimed)

    def _write(self, read: Read) -> None:
        if not read:
            return
        self._unsettled = read  # until settled: an outage in between makes the next step write it again
        records: list[ServedInference] = [record for _, record in read if record is not None]
        unreadable = len(read) - len(records)
        if unreadable:
            log.error("recorder %s: %d record entries cannot be read; dropped", self.consumer, unreadable)
        try:
            if records:
                self.sink.write(records)
        except StoreUnavailable:
            raise  # retried whole by the loop; the records stay pending meanwhile
        except Exception:
            log.exception(
                "recorder %s: a batch of %d records could not be written; dropped", self.consumer, len(records)
            )
            unreadable += len(records)
            records = []
        self.stream.settle([entry_id for entry_id, _ in read])
        self._unsettled = []
        self.recorded += len(records)
        self.dropped += unreadable

    def _idle(self) -> None:
        try:
            self.sink.idle()
            dropped = self.stream.dropped()
            if self._dropped_seen is not None and dropped > self._dropped_seen:
                log.error(
                    "%d records were not written since the last look: the records stream held its bound "
                    "(no recorder kept up; EXAMLOPS_RECORDING__BOUND)",
                    dropped - self._dropped_seen,
                )
            self._dropped_seen = dropped
            self.stream.prune(self.consumer)
        except StoreUnavailable:
            pass  # the next step meets the outage and waits it out
        except Exception:
            log.exception("recorder %s: idle work failed", self.consumer)

    def _retried(self, work: Callable[[], int | None], stop: threading.Event, until: float | None = None) -> int:
        """``work()``, retried with backoff while Redis is unavailable, until ``stop`` or ``until``; 0 then."""
        while not stop.is_set() and (until is None or self.clock() < until):
            try:
                done = work()
            except StoreUnavailable as exc:
                self.retried += 1
                stop.wait(self._outage.lost(exc))
                self.beat()
                continue
            self._outage.back()
            return done or 0
        return 0
