"""The inference recorder: the bridge's ``on_served`` hook, a bounded queue and one background thread.

``Backlog`` is the queue and its thread; ``Recorder`` is the backlog whose thread writes to Redis. A bridge
runs a ``Recorder`` in its recording process (``recorder_process``: the bridge's own thread only ships the
batches there), or, with ``EXAMLOPS_RECORDING__PROCESS=false``, in its own process.

Contract:

- ``record`` runs on the bridge's event loop (or the recording process's reading thread) and never
  blocks: it appends each served inference to a bounded queue (a deque; an event wakes the thread when it
  was empty). Past the bound the item is dropped, counted (``dropped``) and logged once per burst, never
  silently.
- The thread takes up to ``batch_size`` items at a time (when fewer are waiting it lingers ``linger_s``
  for more, so that under load it writes batches instead of waking and calling Redis once per job: a
  batch costs ~0.3 ms of CPU here whatever its size, ~4 us per job at ~80 jobs a batch and ~35 at 8),
  computes the embedding's norm, mean and standard deviation, and writes, per job, one drift snapshot
  and one ``inference.served`` audit event, the whole batch in one atomic script.
- Exactly once per job: the bridge hands over only jobs whose reply it wrote first (its done key, one
  atomic script, decides that; a redelivered job or one another bridge answered never reaches here), and
  each batch's write is idempotent: a write retried after an error whose outcome was unknown (the script
  ran, its reply was lost) finds the batch's key (``examlops:recorded:batch:{id}``) and writes nothing
  twice. There is no key per job: at 2,000 jobs/s one per job would hold ~1.2 million keys (a job's
  deadline plus 600 s) beside the bridge's done keys, and cost about a quarter of the write's Redis time.
- Then the batch's replies are classified and fed to the failure tracker (shared windows and cooldown in
  Redis) in one script per batch, in order; each window state is checked, which may queue a retrain
  request.
- While Redis is unavailable the thread retries with backoff (0.1 s doubling to 2 s) and the queue
  holds what arrives meanwhile; nothing is lost while the bound holds (``retried`` counts the retries).
- A batch taken from the queue counts in the queue depth until it is written; a write that fails other
  than by an outage (a bug, Redis refusing the write) counts its records as dropped, and logs why.
- ``close(timeout)`` flushes the queue and writes a final audit checkpoint; it returns False (and logs
  how many records were left) when the queue could not be flushed in time. It logs what the recorder did,
  with the CPU its thread spent writing (``cpu_s``, also a counter): the bridge's own cost of recording.

Monitoring does not import the bus: ``Served`` is the shape of ``core.records.ServedInference``.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

from examlops.core.errors import StoreUnavailable
from examlops.core.jsoncodec import canonical
from examlops.monitoring.audit import INFERENCE_SERVED, AuditTrail, Row, format_ts
from examlops.monitoring.failures import FailureTracker, classify
from examlops.monitoring.snapshots import MODELS, PACKED, embedding_stats, number, packed, stream_of

log = logging.getLogger(__name__)

T = TypeVar("T")


def batch_key() -> str:
    """A new batch's idempotency key (``AuditTrail.append_rows``'s ``call_key``)."""
    return f"examlops:recorded:batch:{uuid.uuid4().hex}"


class Served(Protocol):
    """One bus inference answered for the first time (``core.records.ServedInference``)."""

    @property
    def job_id(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def caller(self) -> str: ...
    @property
    def embedding(self) -> Sequence[float]: ...
    @property
    def node_count(self) -> int: ...
    @property
    def reply(self) -> Mapping[str, Any]: ...
    @property
    def status(self) -> int: ...
    @property
    def served_at(self) -> float: ...


@dataclass(frozen=True, slots=True)
class RecorderStats:
    recorded: int
    retried: int
    dropped: int
    queue_depth: int
    cpu_s: float = 0.0
    """CPU time the recorder's thread spent preparing and writing records (not waiting)."""


@dataclass(frozen=True, slots=True)
class Tuning:
    """How a backlog queues and batches; the bridge sends its own to its recording process."""

    maxsize: int = 10_000
    """The queue's bound: past it, records are dropped (counted and logged)."""
    batch_size: int = 256
    idle_s: float = 1.0
    """With nothing queued, the thread does its idle work (an audit checkpoint when due) this often."""
    max_backoff_s: float = 2.0
    """The longest wait between two tries while Redis is unavailable."""
    linger_s: float = 0.1
    """How long the thread waits for a batch to fill when fewer than ``batch_size`` are queued."""

    def __post_init__(self) -> None:
        if self.maxsize < 1:
            raise ValueError(f"the recorder's queue needs a bound of at least 1, not {self.maxsize}")
        if self.batch_size < 1:
            raise ValueError(f"a batch must hold at least 1 record, not {self.batch_size}")


DEFAULT_TUNING = Tuning()


class Backlog:
    """A bounded queue filled from the bridge's event loop and emptied in batches by one thread.

    What a subclass writes a batch to is its own (``_write``): Redis (``Recorder``) or the recording
    process (``recorder_process.RecorderProcess``). Counters and the queue depth are exported under
    ``examlops_recorder_*``.
    """

    label = "recorder"
    """How the totals logged at close name this queue."""

    def __init__(self, tuning: Tuning = DEFAULT_TUNING, *, registry: CollectorRegistry | None = None) -> None:
        self.tuning = tuning
        self.maxsize = tuning.maxsize
        self.batch_size = tuning.batch_size
        self.idle_s = tuning.idle_s
        self.linger_s = tuning.linger_s
        self.max_backoff_s = tuning.max_backoff_s
        # A deque and an event rather than a queue.Queue: a put and a get cost ~0.05 us instead of ~1 us (the
        # queue's lock and condition), and the put runs on the bridge's event loop once per job.
        self._queue: collections.deque[Served] = collections.deque()
        self._arrived = threading.Event()
        self._closing = threading.Event()
        self._abandon = threading.Event()
        self._thread: threading.Thread | None = None
        self._dropping = 0
        self._in_hand = 0
        """Records the thread has taken from the queue and not yet written (or shipped)."""
        self._drop_lock = threading.Lock()
        self.recorded = self.retried = self.dropped = 0
        self.cpu_s = 0.0
        registry = registry if registry is not None else CollectorRegistry()
        name = "examlops_recorder"
        self._m_recorded = Counter(f"{name}_recorded", "Jobs recorded (snapshot + audit event)", registry=registry)
        self._m_retried = Counter(f"{name}_retried", "Writes retried while Redis was unavailable", registry=registry)
        self._m_dropped = Counter(f"{name}_dropped", "Records dropped: queue full or unrecordable", registry=registry)
        self._m_cpu = Counter(f"{name}_cpu_seconds", "CPU the recorder's thread spent writing", registry=registry)
        depth = Gauge(f"{name}_queue_depth", "Records waiting to be written", registry=registry)
        depth.set_function(self.depth)

    def start(self) -> Backlog:
        self._thread = threading.Thread(target=self._run, name=f"examlops-{self.label}", daemon=True)
        self._thread.start()
        return self

    # The bridge's side (its event loop): never blocks.

    def record(self, served: Sequence[Served]) -> None:
        """Queue ``served`` for the thread; called from one thread only (the bridge's event loop).

        One producer is what makes the deque's bound check and the wake-up on an empty queue race-free.
        """
        for item in served:
            if self._closing.is_set():
                self._drop(1, f"job {item.job_id} arrived after the recorder was closed")
                continue
            if len(self._queue) >= self.maxsize:
                if not self._dropping:
                    log.error("recorder queue full (%d): dropping records until it drains", self.maxsize)
                self._dropping += 1
                self._drop(1)
                continue
            self._queue.append(item)
            if len(self._queue) == 1:  # it was empty: the thread may be waiting
                self._arrived.set()
            if self._dropping:
                log.warning("recorder queue has room again; %d records were dropped", self._dropping)
                self._dropping = 0

    def discard(self, n: int, why: str) -> None:
        """Count (and log) ``n`` records that could not even be queued, such as an unreadable batch."""
        self._drop(n, why)

    def _drop(self, n: int, why: str | None = None) -> None:
        with self._drop_lock:  # the event loop and the thread both drop
            self.dropped += n
            self._m_dropped.inc(n)
        if why:
            log.error("record dropped: %s", why)

    def depth(self) -> int:
        """Records queued or taken and not yet written."""
        return len(self._queue) + self._in_hand

    def stats(self) -> RecorderStats:
        return RecorderStats(self.recorded, self.retried, self.dropped, self.depth(), self.cpu_s)

    def close(self, timeout: float = 10.0) -> bool:
        """Flush what is queued and stop; False when that took longer than ``timeout``.

        Records still unwritten then are counted as dropped (and logged): the bridge is stopping.
        """
        self._closing.set()
        self._arrived.set()
        if self._thread is None:
            return not self._queue
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._log_totals()
            return True
        self._abandon.set()
        self._thread.join(self.max_backoff_s + 1)
        left = len(self._queue)
        self._queue.clear()
        self._drop(left)
        log.error("recorder closed after %.0f s with %d queued records unwritten (Redis unavailable?)", timeout, left)
        self._log_totals()
        return False

    def _log_totals(self) -> None:
        per_job = 1e6 * self.cpu_s / self.recorded if self.recorded else 0.0
        log.info(
            "%s: %d recorded, %d retries, %d dropped; %.3f s of CPU writing (%.1f us per record)",
            self.label,
            self.recorded,
            self.retried,
            self.dropped,
            self.cpu_s,
            per_job,
        )

    # The thread.

    def _run(self) -> None:
        while True:
            # Clear, then look: a record that arrives after the look finds the queue empty and sets the event.
            self._arrived.clear()
            if not self._queue:
                if self._closing.is_set():
                    break
                if not self._arrived.wait(self.idle_s):
                    self._guarded(self._idle)
                continue
            batch: list[Served] = []
            self._fill(batch)
            if len(batch) < self.batch_size and self.linger_s > 0 and not self._closing.is_set():
                # Sleep rather than wait on the queue: a waiting getter makes every put from the event loop
                # wake this thread, one GIL switch per job.
                self._closing.wait(self.linger_s)
                self._fill(batch)
            began = time.thread_time()
            try:
                self._write(batch)
            except Exception as exc:  # not a Redis outage (those are retried): what it held is lost, and said so
                log.exception("the %s failed to write a batch", self.label)
                self._drop(self._in_hand, f"{self._in_hand} records could not be written ({exc!r})")
            self._spent(time.thread_time() - began)
            self._in_hand = 0
            if self._abandon.is_set():
                return
        self._guarded(self._finish)

    def _spent(self, seconds: float) -> None:
        self.cpu_s += seconds
        self._m_cpu.inc(seconds)

    def _fill(self, batch: list[Served]) -> None:
        """Take what fits in ``batch``; it counts in the queue depth (``_in_hand``) until ``_write`` settles it."""
        take = self._queue.popleft
        for _ in range(min(self.batch_size - len(batch), len(self._queue))):
            batch.append(take())
        self._in_hand = len(batch)

    def _guarded(self, work: Callable[[], object]) -> None:
        try:
            work()
        except Exception:
            log.exception("the %s failed a step", self.label)

    def _each(self, batch: Sequence[Served], convert: Callable[[Served], T]) -> tuple[list[Served], list[T]]:
        """The records that ``convert`` takes, and what it makes of them; one it raises for is dropped."""
        kept: list[Served] = []
        made: list[T] = []
        for served in batch:
            try:
                made.append(convert(served))
            except Exception as exc:
                self._drop(1, f"job {served.job_id} cannot be recorded: {exc}")
            else:
                kept.append(served)
        return kept, made

    def _write(self, batch: Sequence[Served]) -> None:
        """Write (or ship) ``batch``; ``_in_hand`` is what of it is still unsettled (dropped on an exception)."""
        raise NotImplementedError

    def _idle(self) -> None:
        """Called by the thread after ``idle_s`` with nothing queued."""

    def _finish(self) -> None:
        """Called by the thread once the queue is flushed at close."""


class Recorder(Backlog):
    """Writes each batch to Redis from its thread: snapshots, audit events, failure windows."""

    def __init__(
        self,
        trail: AuditTrail,
        tracker: FailureTracker | None = None,
        tuning: Tuning = DEFAULT_TUNING,
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        super().__init__(tuning, registry=registry)
        self.trail = trail
        self.tracker = tracker
        self._down = False

    def start(self) -> Recorder:
        super().start()
        return self

    def _idle(self) -> None:
        self.trail.tick()

    def _finish(self) -> None:
        self.trail.checkpoint_now()

    def _write(self, batch: Sequence[Served]) -> None:
        kept, rows = self._each(batch, _row)
        self._in_hand = len(rows)
        if not rows:
            return
        key = batch_key()  # the same key on every retry of this batch
        if self._until_done(lambda: self.trail.append_rows(rows, PACKED, call_key=key)) is None:
            self._in_hand = 0
            self._drop(len(rows), f"{len(rows)} records abandoned at close")
            return
        self._in_hand = 0
        self.recorded += len(rows)
        self._m_recorded.inc(len(rows))
        if self.tracker is not None:
            self._observe(self.tracker, kept, f"{key}:failures")

    def _observe(self, tracker: FailureTracker, fresh: Sequence[Served], key: str) -> None:
        """One push for the batch (retried whole, under one call key), then a check per state, in order."""
        outcomes = [(served.model, classify(served.status, served.reply)) for served in fresh]
        states = self._until_done(functools.partial(tracker.push_many, outcomes, call_key=key))
        if states is None:
            return
        for (model, _), state in zip(outcomes, states, strict=True):
            if state is not None and tracker.due(state):
                self._until_done(functools.partial(tracker.check, model, state))

    def _until_done(self, work: Callable[[], T]) -> T | None:
        """``work()``, retried with backoff while Redis is unavailable; None only when abandoned at close."""
        attempts = 0
        while not self._abandon.is_set():
            try:
                result = work()
            except StoreUnavailable as exc:
                attempts += 1
                self.retried += 1
                self._m_retried.inc()
                if not self._down:
                    log.warning("recorder: %s; records wait in the queue and are retried", exc)
                self._down = True
                self._abandon.wait(min(self.max_backoff_s, 0.1 * 2 ** (attempts - 1)))
                continue
            if self._down:
                log.warning("recorder: Redis reachable again; %d records queued", len(self._queue))
            self._down = False
            return result
        return None


def _row(served: Served) -> Row:
    """The audit event of one served job, with its snapshot as the side write (computed off the event loop).

    Builds what ``Entry(..., side=snapshot_of(...).side_write()).row()`` gives without the intermediate
    objects: this runs once per bus job. A record that carries its embedding's statistics already
    (``embedding_stats``: the recording process receives them so, ``recorder_process.Shipped``) is not
    given its embedding.
    """
    reply = served.reply
    code = "" if reply.get("error") is None else str(reply.get("code") or "error")
    alias = str(reply.get("alias") or "")
    version = str(reply.get("version") or "")
    run_id = str(reply.get("run_id") or "")
    prediction = number(reply.get("prediction"))
    precomputed: tuple[float, float, float] | None = getattr(served, "embedding_stats", None)
    norm, mean, std = precomputed or embedding_stats(served.embedding)
    model, job_id, user_id, ts, status = served.model, served.job_id, served.caller, served.served_at, served.status
    row = (
        model, alias, version, run_id, prediction, norm, mean, std, served.node_count, job_id, user_id, float(ts),
        status, code,
    )  # fmt: skip
    data = {
        "job_id": job_id,
        "user_id": user_id,
        "alias": alias,
        "version": version,
        "run_id": run_id,
        "prediction": prediction,
        "status": status,
        "code": code,
    }
    return ("", stream_of(model), (packed(row),), MODELS, model.lower(), format_ts(ts), INFERENCE_SERVED, model,
            canonical(data))  # fmt: skip
