"""The recording process: the bridge's records are written by a child process at a low CPU priority.

Why a process and not the writing thread alone (measured with ``bench/recording_cost.py`` at c=32 on two
cores, where client, Redis, bridge and serving share the cores): the load leaves the cores ~20 % idle, yet a
thread in the bridge that spends 20 us of CPU per job cost ~6-10 % of the throughput, and the same work in a
process at normal priority ~6.5 %: work at normal priority takes its core at moments the jobs' path needs
it. The same 20 us in a process at nice 19 cost ~0-1 % (within the bench's noise): it ran in the idle time.
A thread cannot be given that priority usefully, as it shares the bridge's GIL: a low-priority thread that
holds the GIL while preempted stalls the event loop.

Contract:

- ``RecorderProcess`` is the bridge's side. Its thread (``recorder.Backlog``: the bounded queue, batches,
  linger, close) ships each batch to the child as one frame on the child's stdin: a 4-byte big-endian length
  and a pickle of plain tuples, with the embedding's norm, mean and standard deviation in place of the
  embedding. Those are computed here (~2.3 us a job for 384 floats, in ``math``'s C loops): shipping the
  floats would cost as much (packed as doubles, ~2.2 us; pickled as floats, ~5) and put ~3 KB a job
  through the pipe. Pickle is safe here: the frames come from the child's own parent over a private pipe.
- The first frame is the ``hello``: what the child needs to connect (the bridge's settings as JSON).
- The child (``serve``) feeds the frames to a ``recorder.Recorder``, which writes them to Redis exactly as
  in the bridge's own thread (batches under call keys, retries while Redis is down, the failure windows),
  and writes its counters back as JSON lines on its stdout every ``report_every_s`` and on exit.
- EOF on its stdin (the bridge closed it, or died) makes the child flush its queue, checkpoint and exit.
  It ignores SIGINT and SIGTERM: a Ctrl-C or ``exa down`` reaches the bridge, which then closes the pipe
  and waits for the flush, so that nothing queued is lost to the signal.
- A child that exits while the bridge runs is started again (at most once per ``restart_s``). A frame whose
  write failed is shipped again to the next child; frames it had taken and not written (``shipped`` minus
  its last ``recorded`` and ``dropped``) are counted as dropped and logged: at most the batches it held,
  some of which it may have written just before it died.
- ``stats()`` and the ``examlops_recorder_*`` counters add the child's figures to the bridge's own drops;
  the queue depth counts both the bridge's queue and what the child holds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import signal
import struct
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, NamedTuple

from prometheus_client import CollectorRegistry

from examlops.monitoring.recorder import Backlog, RecorderStats, Served
from examlops.monitoring.snapshots import embedding_stats

log = logging.getLogger(__name__)

FRAME = struct.Struct(">I")
MAX_FRAME = 1 << 30


class Shipped(NamedTuple):
    """One served inference as the child receives it: the ``recorder.Served`` shape, with the embedding's
    statistics (``embedding_stats``) in place of the embedding."""

    job_id: str
    model: str
    caller: str
    embedding_stats: tuple[float, float, float]
    node_count: int
    reply: Mapping[str, Any]
    status: int
    served_at: float

    @property
    def embedding(self) -> Sequence[float]:
        return ()


def frame(body: bytes) -> bytes:
    return FRAME.pack(len(body)) + body


def encode_batch(batch: Sequence[Served]) -> bytes:
    """One frame for ``batch``: a pickle of plain tuples, the embedding's statistics in place of the embedding."""
    rows = [
        (s.job_id, s.model, s.caller, embedding_stats(s.embedding), s.node_count, dict(s.reply), s.status, s.served_at)
        for s in batch
    ]
    return frame(pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL))


def decode_batch(body: bytes) -> list[Shipped]:
    rows = pickle.loads(body)  # from the child's parent, over a private pipe
    return [Shipped(*row) for row in rows]


def read_frame(stream: IO[bytes]) -> bytes | None:
    """The next frame's body; None at EOF (also in the middle of a frame: its writer is gone)."""
    header = stream.read(FRAME.size)
    if len(header) < FRAME.size:
        return None
    (size,) = FRAME.unpack(header)
    if size > MAX_FRAME:
        raise ValueError(f"a recording frame of {size} bytes: the pipe is out of step")
    body = stream.read(size)
    return body if len(body) == size else None


# The child's side.


@dataclass
class _Totals:
    recorded: int = 0
    retried: int = 0
    dropped: int = 0
    cpu_s: float = 0.0

    @classmethod
    def of(cls, stats: RecorderStats) -> _Totals:
        return cls(stats.recorded, stats.retried, stats.dropped, stats.cpu_s)


def serve(
    recorder: Backlog, frames: IO[bytes], reports: IO[bytes], *, report_every_s: float = 0.1, close_s: float = 10.0
) -> bool:
    """The child's loop: each frame's records into ``recorder``, its counters out, until EOF; then close it.

    Returns what ``recorder.close`` returned (False: records were left unwritten).
    """
    stop = threading.Event()
    lock = threading.Lock()

    def report() -> None:
        with lock:
            totals = _Totals.of(recorder.stats())
            reports.write(json.dumps(totals.__dict__).encode() + b"\n")
            reports.flush()

    def reporter() -> None:
        last = None
        while not stop.wait(report_every_s):
            now = recorder.stats()
            if now != last:
                report()
                last = now

    thread = threading.Thread(target=reporter, name="examlops-recording-reports", daemon=True)
    thread.start()
    try:
        while True:
            try:
                body = read_frame(frames)
            except ValueError:
                log.exception("recording process: unreadable input; stopping")
                break
            if body is None:
                break
            try:
                items = decode_batch(body)
            except Exception:
                log.exception("recording process: a batch could not be read; its records are lost")
                continue
            recorder.record(items)
    finally:
        flushed = recorder.close(close_s)
        stop.set()
        thread.join()
        report()
    return flushed


def ignore_stop_signals() -> None:
    """The child stops when its stdin closes, after flushing; never halfway through on a signal."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def lower_priority(nice: int) -> None:
    if nice > 0 and hasattr(os, "nice"):
        os.nice(nice)


# The bridge's side.


class RecorderProcess(Backlog):
    """The bridge's recorder when recording runs in a child process (``argv``, sent ``hello`` first)."""

    label = "recording process"

    def __init__(
        self,
        argv: Sequence[str],
        hello: bytes,
        *,
        maxsize: int = 10_000,
        batch_size: int = 256,
        registry: CollectorRegistry | None = None,
        idle_s: float = 1.0,
        max_backoff_s: float = 2.0,
        linger_s: float = 0.1,
        restart_s: float = 1.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            maxsize=maxsize,
            batch_size=batch_size,
            registry=registry,
            idle_s=idle_s,
            max_backoff_s=max_backoff_s,
            linger_s=linger_s,
        )
        self.argv = list(argv)
        self.hello = hello
        self.env = dict(env) if env is not None else None
        self.restart_s = restart_s
        self.restarts = 0
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._next_start = 0.0
        self._shipped = 0
        """Records in frames written whole to the current child."""
        self._last = _Totals()
        """The current child's last report."""
        self._past = _Totals()
        """What children that have exited reported, all together."""
        self._deadline = float("inf")

    def start(self) -> RecorderProcess:
        with self._lock:
            self._spawn()
        super().start()
        return self

    # Counters.

    @property
    def pid(self) -> int | None:
        """The running child's process id."""
        child = self._child
        return child.pid if child is not None else None

    def held(self) -> int:
        """Records shipped to the running child and not yet reported written (or dropped) by it."""
        with self._lock:
            return max(0, self._shipped - self._last.recorded - self._last.dropped)

    def depth(self) -> int:
        with self._lock:
            return self._depth()

    def _depth(self) -> int:
        return len(self._queue) + max(0, self._shipped - self._last.recorded - self._last.dropped)

    def stats(self) -> RecorderStats:
        with self._lock:
            return RecorderStats(
                self._past.recorded + self._last.recorded,
                self._past.retried + self._last.retried,
                self.dropped + self._past.dropped + self._last.dropped,
                self._depth(),
                self.cpu_s + self._past.cpu_s + self._last.cpu_s,
            )

    def _log_totals(self) -> None:
        stats = self.stats()
        log.info(
            "%s: %d recorded, %d retries, %d dropped, %d restarts; %.3f s of CPU shipping in the bridge",
            self.label,
            stats.recorded,
            stats.retried,
            stats.dropped,
            self.restarts,
            self.cpu_s,
        )

    # The child.

    def _spawn(self) -> None:
        """Start a child and send it the hello (under ``_lock``); on failure, try again after ``restart_s``."""
        self._next_start = time.monotonic() + self.restart_s
        try:
            child = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env)
        except OSError:
            log.exception("the recording process could not be started")
            return
        assert child.stdin is not None
        try:
            child.stdin.write(frame(self.hello))
            child.stdin.flush()
        except OSError:
            try:
                code = child.wait(5)
            except subprocess.TimeoutExpired:
                child.kill()
                code = child.wait()
            log.error("the recording process exited at once (code %s)", code)
            return
        self._child, self._shipped, self._last = child, 0, _Totals()
        self._reader = threading.Thread(target=self._read_reports, args=(child,), name="examlops-recording-reader")
        self._reader.daemon = True
        self._reader.start()

    def _read_reports(self, child: subprocess.Popen[bytes]) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            try:
                now = _Totals(**json.loads(line))
            except (ValueError, TypeError):
                log.warning("recording process: unreadable report %r", line[:200])
                continue
            with self._lock:
                if child is not self._child:
                    return
                last, self._last = self._last, now
            self._m_recorded.inc(max(0, now.recorded - last.recorded))
            self._m_retried.inc(max(0, now.retried - last.retried))
            self._m_dropped.inc(max(0, now.dropped - last.dropped))
            self._m_cpu.inc(max(0.0, now.cpu_s - last.cpu_s))

    def _reap(self, *, wait_s: float = 0.0) -> bool:
        """True when there is no child, or it has exited (then its figures are settled, once)."""
        child = self._child
        if child is None:
            return True
        try:
            code = child.wait(wait_s) if wait_s > 0 else child.poll()
        except subprocess.TimeoutExpired:
            return False
        if code is None:
            return False
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(5)  # its last report is read before its stdout closes
        with self._lock:
            if self._child is not child:
                return True  # settled by another thread
            lost = self._shipped - self._last.recorded - self._last.dropped
            self._past.recorded += self._last.recorded
            self._past.retried += self._last.retried
            self._past.dropped += self._last.dropped
            self._past.cpu_s += self._last.cpu_s
            self._child, self._shipped, self._last = None, 0, _Totals()
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        if lost > 0:
            self._drop(lost, f"the recording process exited (code {code}) holding {lost} records")
        elif code != 0 or not self._closing.is_set():
            log.error("the recording process exited (code %s)", code)
        return True

    def _ready(self) -> subprocess.Popen[bytes] | None:
        self._reap()
        with self._lock:
            if self._child is None and time.monotonic() >= self._next_start and not self._abandon.is_set():
                self.restarts += 1
                log.warning("starting the recording process again")
                self._spawn()
            return self._child

    def _write(self, batch: Sequence[Served]) -> None:
        try:
            data = encode_batch(batch)
        except Exception as exc:  # a record that does not pickle: find it, ship the rest
            kept = []
            for served in batch:
                try:
                    encode_batch([served])
                except Exception:
                    self._drop(1, f"job {served.job_id} cannot be recorded: {exc}")
                else:
                    kept.append(served)
            if not kept:
                return
            data = encode_batch(kept)
            batch = kept
        while not self._abandon.is_set():
            child = self._ready()
            if child is None:
                self._abandon.wait(min(self.restart_s, 0.1))
                continue
            assert child.stdin is not None
            with self._lock:
                self._shipped += len(batch)  # before the write: its reports may come before the write returns
            try:
                child.stdin.write(data)
                child.stdin.flush()
                return
            except (OSError, ValueError):  # the child is gone: this frame never reached it whole
                with self._lock:
                    if child is self._child:
                        self._shipped -= len(batch)
                self._reap(wait_s=5)
        self._drop(len(batch), f"{len(batch)} records abandoned at close")

    def _idle(self) -> None:
        self._ready()

    def close(self, timeout: float = 10.0) -> bool:
        """Ship what is queued, close the child's stdin and wait for it to flush and exit.

        False when that took longer than ``timeout``: the child is then stopped, and what it held is
        counted as dropped.
        """
        self._deadline = time.monotonic() + timeout
        flushed = super().close(timeout)
        child = self._child
        if child is None:
            return flushed
        if child.poll() is None:
            log.error("the recording process did not flush in %.0f s; stopping it", timeout)
            child.kill()
        self._reap(wait_s=5)
        self._log_totals()
        return False

    def _finish(self) -> None:
        """The queue is shipped: close the child's stdin and wait until it has flushed and exited."""
        child = self._child
        if child is None:
            return
        assert child.stdin is not None
        with contextlib.suppress(OSError):
            child.stdin.close()
        self._reap(wait_s=max(0.01, self._deadline - time.monotonic()))
