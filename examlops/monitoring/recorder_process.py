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
  linger, close) ships each batch to the child as one frame on the child's stdin: a header (the body's
  length and its record count, 4 bytes each, big-endian) and a pickle of plain tuples, with the embedding's
  norm, mean and standard deviation in place of the embedding. Those are computed here (~2.3 us a job for
  384 floats, in ``math``'s C loops): shipping the floats would cost as much (packed as doubles, ~2.2 us;
  pickled as floats, ~5) and put ~3 KB a job through the pipe. Pickle is safe here: the frames come from
  the child's own parent over a private pipe. A frame with a count of 0 is a control message (JSON).
- The first frame is the hello: what the child needs to connect (the bridge's settings, opaque here), the
  queue's tuning and the nice value it takes once connected (its start-up runs at normal priority: on a
  busy machine, two busy loops on the two cores, a child starting at nice 19 had not written 300 records
  after 30 s). The child answers with a first report once it is connected; nothing is shipped to a child
  before that, so a child that fails at start-up takes no records with it.
- The bound: the bridge's queue holds at most ``maxsize`` records, and it ships only while the child holds
  fewer than ``maxsize`` (shipped and not yet reported written or dropped), so the child's own queue (of
  the same size) never overflows. Past the bound, ``record`` drops, counts and logs, in the bridge. At nice
  19 the child gets ~1.5 % of the cores when normal-priority work saturates them (~30 ms of CPU a second
  here, ~2,500 records at ~12 us); past that, under sustained saturation, its backlog grows to the bound.
- The child (``serve``) feeds the frames to a ``recorder.Recorder``, which writes them to Redis exactly as
  in the bridge's own thread (batches under call keys, retries while Redis is down, the failure windows),
  and writes its counters back as JSON lines on its stdout every ``report_every_s`` and on exit.
- At close the bridge ships what is queued, sends the time left (a control frame) and closes the child's
  stdin; the child flushes within that time, checkpoints, reports and exits. EOF without that (the bridge
  died) makes it flush within 10 s. It ignores SIGINT and SIGTERM: a Ctrl-C or `exa down` reaches the
  bridge, which then closes the pipe and waits for the flush, so nothing queued is lost to the signal
  (`exa down`'s SIGKILL after its grace reaches the child too: they share the process group).
- A child that exits while the bridge runs is started again, after ``restart_s`` doubling up to
  ``max_restart_s`` while children keep exiting without writing anything. A child reports at least every
  second; one that has not reported ``start_timeout_s`` after its start, or is silent for ``silence_s``,
  is stopped (and so started again). A frame whose write failed is
  shipped again to the next child; records a child had taken and not written (its last report) are
  counted as dropped and logged: at most what it held, some of which it may have written just before it
  died.
- ``stats()`` and the ``examlops_recorder_*`` counters add the child's figures to the bridge's own drops;
  the queue depth counts both the bridge's queue and what the child holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import pickle
import signal
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import IO, Any, NamedTuple

from prometheus_client import CollectorRegistry

from examlops.monitoring.recorder import DEFAULT_TUNING, Backlog, RecorderStats, Served, Tuning
from examlops.monitoring.snapshots import embedding_stats

log = logging.getLogger(__name__)

HEADER = struct.Struct(">II")
"""A frame's header: the body's length and its record count (0: a control message)."""
MAX_FRAME = 1 << 30
EOF_CLOSE_S = 10.0
"""How long a child flushes after an EOF that came without a close message (its bridge died)."""
HEARTBEAT_S = 1.0
"""A child reports at least this often, also when nothing changed."""


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


@dataclass(frozen=True)
class Hello:
    """The first frame: the child's configuration (opaque here; the bridge's settings), its queue's tuning
    and the nice value it takes once started."""

    config: str
    tuning: Tuning
    nice: int = 0

    def encode(self) -> bytes:
        return control({"config": self.config, "tuning": asdict(self.tuning), "nice": self.nice})


def frame(body: bytes, count: int) -> bytes:
    return HEADER.pack(len(body), count) + body


def control(message: Mapping[str, Any]) -> bytes:
    return frame(json.dumps(message).encode(), 0)


def encode_batch(batch: Sequence[Served]) -> bytes:
    """One frame for ``batch``: a pickle of plain tuples, the embedding's statistics in place of the embedding."""
    rows = [
        (s.job_id, s.model, s.caller, embedding_stats(s.embedding), s.node_count, dict(s.reply), s.status, s.served_at)
        for s in batch
    ]
    return frame(pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL), len(rows))


def decode_batch(body: bytes) -> list[Shipped]:
    rows = pickle.loads(body)  # from the child's parent, over a private pipe
    return [Shipped(*row) for row in rows]


def read_frame(stream: IO[bytes]) -> tuple[int, bytes] | None:
    """The next frame's (record count, body); None at EOF (also in the middle of a frame: its writer is gone)."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    size, count = HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ValueError(f"a recording frame of {size} bytes: the pipe is out of step")
    body = stream.read(size)
    return (count, body) if len(body) == size else None


def read_hello(stream: IO[bytes]) -> Hello | None:
    """The hello frame; None at EOF (the bridge went away before saying anything)."""
    got = read_frame(stream)
    if got is None:
        return None
    count, body = got
    if count != 0:
        raise ValueError("the recording process's first frame must be its hello")
    data = json.loads(body)
    return Hello(str(data["config"]), Tuning(**data["tuning"]), int(data["nice"]))


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

    @classmethod
    def parse(cls, line: bytes) -> _Totals:
        """``ValueError``, ``TypeError`` or ``KeyError`` for a line that is not a report."""
        data = json.loads(line)
        return cls(int(data["recorded"]), int(data["retried"]), int(data["dropped"]), float(data["cpu_s"]))


def serve(
    recorder: Backlog,
    frames: IO[bytes],
    reports: IO[bytes],
    *,
    report_every_s: float = 0.1,
    heartbeat_s: float = HEARTBEAT_S,
) -> bool:
    """The child's loop: each frame's records into ``recorder``, its counters out, until EOF; then close it.

    Reports once at once (the bridge ships nothing before that first report), then whenever the counters
    changed and at least every ``heartbeat_s`` (the bridge takes a silent child for a stuck one), and last
    after the close. Returns what ``recorder.close`` returned (False: records were left unwritten).
    """
    stop = threading.Event()
    lock = threading.Lock()
    close_s = EOF_CLOSE_S

    def report() -> None:
        with lock, contextlib.suppress(OSError, ValueError):  # the bridge is gone: nobody to tell
            reports.write(json.dumps(asdict(_Totals.of(recorder.stats()))).encode() + b"\n")
            reports.flush()

    def reporter() -> None:
        last, sent = recorder.stats(), time.monotonic()
        while not stop.wait(report_every_s):
            now = recorder.stats()
            if now != last or time.monotonic() - sent >= heartbeat_s:
                report()
                last, sent = now, time.monotonic()

    report()
    thread = threading.Thread(target=reporter, name="examlops-recording-reports", daemon=True)
    thread.start()
    try:
        while True:
            try:
                got = read_frame(frames)
            except ValueError:
                log.exception("recording process: unreadable input; stopping")
                break
            if got is None:
                break
            count, body = got
            if count == 0:
                with contextlib.suppress(ValueError, TypeError, KeyError):
                    close_s = float(json.loads(body)["close_s"])
                continue
            try:
                items = decode_batch(body)
            except Exception as exc:
                recorder.discard(count, f"a batch of {count} records could not be read ({exc})")
                continue
            recorder.record(items)
    finally:
        flushed = recorder.close(close_s)
        stop.set()
        thread.join()
        report()
    return flushed


def lower_priority(nice: int) -> None:
    """Called by the child once it has started: start-up (imports, SQL tables) runs at normal priority, so
    that on a busy machine a new child is not left starting for a long time."""
    if nice > 0 and hasattr(os, "nice"):
        os.nice(nice)


def ignore_stop_signals() -> None:
    """The child stops when its stdin closes, after flushing; never halfway through on a signal."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


# The bridge's side.


class RecorderProcess(Backlog):
    """The bridge's recorder when recording runs in a child process (``argv``; ``config`` goes in its hello)."""

    label = "recording process"

    def __init__(
        self,
        argv: Sequence[str],
        config: str,
        tuning: Tuning = DEFAULT_TUNING,
        *,
        registry: CollectorRegistry | None = None,
        nice: int = 19,
        tick: Callable[[], None] | None = None,
        restart_s: float = 1.0,
        max_restart_s: float = 30.0,
        start_timeout_s: float = 60.0,
        silence_s: float = 30.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        # A batch larger than the child's bound could never be shipped.
        tuning = dataclasses.replace(tuning, batch_size=min(tuning.batch_size, tuning.maxsize))
        super().__init__(tuning, registry=registry)
        self.argv = list(argv)
        self.hello = Hello(config, tuning, nice)
        self.tick = tick
        self.env = dict(env) if env is not None else None
        self.restart_s = restart_s
        self.max_restart_s = max_restart_s
        self.start_timeout_s = start_timeout_s
        """A child that has not reported this long after its start is stopped (and started again)."""
        self.silence_s = silence_s
        """A child silent this long (it reports every ``HEARTBEAT_S``) is taken for stuck and stopped."""
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._connected = False
        """Whether the current child has reported (it is connected; frames may go to it)."""
        self._started = 0
        """Children started so far."""
        self._failures = 0
        """Children in a row that exited without writing anything: the restart delay doubles with each."""
        self._next_start = 0.0
        self._heard_at = 0.0
        """When the current child last reported, or started."""
        self._exit_code: int | None = None
        self._shipped = 0
        """Records in frames written to the current child, the one being written included."""
        self._writing = 0
        """Records in the frame being written to the current child."""
        self._last = _Totals()
        """The current child's last report."""
        self._past = _Totals()
        """What children that have exited reported, all together."""
        self._deadline = float("inf")
        self._clean = True
        """Whether the child stopped by ``close`` (if one ran) exited with 0: it flushed everything."""

    def start(self) -> RecorderProcess:
        self._spawn()
        super().start()
        return self

    # Counters.

    @property
    def restarts(self) -> int:
        """Children started after the first."""
        return max(0, self._started - 1)

    @property
    def pid(self) -> int | None:
        """The running child's process id."""
        child = self._child
        return child.pid if child is not None else None

    @property
    def connected(self) -> bool:
        """Whether a child runs and has reported (records are shipped only to such a child)."""
        return self._child is not None and self._connected

    def held(self) -> int:
        """Records shipped to the running child and not yet reported written (or dropped) by it."""
        with self._lock:
            return self._held()

    def _held(self) -> int:
        return max(0, self._shipped - self._last.recorded - self._last.dropped)

    def depth(self) -> int:
        with self._lock:
            return len(self._queue) + self._in_hand + self._held()

    def stats(self) -> RecorderStats:
        with self._lock:
            return RecorderStats(
                self._past.recorded + self._last.recorded,
                self._past.retried + self._last.retried,
                self.dropped + self._past.dropped + self._last.dropped,
                len(self._queue) + self._in_hand + self._held(),
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
        """Start a child and send it the hello; on failure, try again after the restart delay."""
        try:
            child = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env)
        except OSError:
            log.exception("the recording process could not be started")
            self._failed()
            return
        assert child.stdin is not None
        try:
            child.stdin.write(self.hello.encode())
            child.stdin.flush()
        except OSError:
            code = _stop(child)
            log.error("the recording process exited at once (code %s)", code)
            self._failed()
            return
        reader = threading.Thread(target=self._read_reports, args=(child,), name="examlops-recording-reader")
        reader.daemon = True
        with self._lock:
            self._child, self._reader, self._connected = child, reader, False
            self._shipped, self._writing, self._last = 0, 0, _Totals()
            self._heard_at = time.monotonic()
            self._started += 1
        reader.start()

    def _failed(self) -> None:
        with self._lock:
            self._failures += 1
            delay = min(self.max_restart_s, self.restart_s * 2 ** (self._failures - 1))
            self._next_start = time.monotonic() + delay

    def _read_reports(self, child: subprocess.Popen[bytes]) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            try:
                now = _Totals.parse(line)
            except (ValueError, TypeError, KeyError):
                log.warning("recording process: unreadable report %r", line[:200])
                continue
            with self._lock:
                if child is not self._child:
                    return
                last, self._last, self._connected = self._last, now, True
                self._heard_at = time.monotonic()
                if now.recorded > last.recorded:
                    self._failures = 0
            self._m_recorded.inc(max(0, now.recorded - last.recorded))
            self._m_retried.inc(max(0, now.retried - last.retried))
            self._m_dropped.inc(max(0, now.dropped - last.dropped))
            self._m_cpu.inc(max(0.0, now.cpu_s - last.cpu_s))

    def _reap(self, *, wait_s: float = 0.0) -> bool:
        """True when there is no child, or it has exited (then its figures are settled, once)."""
        with self._lock:
            child, reader = self._child, self._reader
        if child is None:
            return True
        try:
            code = child.wait(wait_s) if wait_s > 0 else child.poll()
        except subprocess.TimeoutExpired:
            return False
        if code is None:
            return False
        if reader is not None and reader is not threading.current_thread():
            reader.join(5)  # its last report is read before its stdout closes
        with self._lock:
            if self._child is not child:
                return True  # settled by another thread
            # The frame being written is its writer's to settle: shipped again, or dropped.
            lost = self._shipped - self._writing - self._last.recorded - self._last.dropped
            self._past.recorded += self._last.recorded
            self._past.retried += self._last.retried
            self._past.dropped += self._last.dropped
            self._past.cpu_s += self._last.cpu_s
            self._child, self._reader, self._shipped, self._writing, self._last = None, None, 0, 0, _Totals()
            self._exit_code = code
        _close_pipes(child)
        if lost > 0:
            self._drop(lost, f"the recording process exited (code {code}) holding {lost} records")
        if not self._closing.is_set() or code != 0:
            log.error("the recording process exited (code %s)", code)
            self._failed()
        return True

    def _connected_child(self) -> subprocess.Popen[bytes] | None:
        """The running child once it has reported; starts one when none runs and the delay has passed.

        A child that does not report within ``start_timeout_s`` of its start, or goes silent for
        ``silence_s`` after, is stopped: what it held is counted as dropped, and another is started.
        """
        self._reap()
        with self._lock:
            child, connected, silent = self._child, self._connected, time.monotonic() - self._heard_at
        if child is not None and silent > (self.silence_s if connected else self.start_timeout_s):
            what = "went silent" if connected else "did not start"
            log.error("the recording process %s (no report for %.0f s); stopping it", what, silent)
            with contextlib.suppress(OSError):
                child.kill()
            self._reap(wait_s=5)
            return None
        if child is None and time.monotonic() >= self._next_start and not self._abandon.is_set():
            log.warning("starting the recording process again")
            self._spawn()
        return child if connected else None

    def _write(self, batch: Sequence[Served]) -> None:
        try:
            data = encode_batch(batch)
        except Exception:  # a record that does not pickle: find it, ship the rest
            kept, _ = self._each(batch, lambda served: encode_batch([served]))
            self._in_hand = len(kept)
            if not kept:
                return
            batch, data = kept, encode_batch(kept)
        n = len(batch)
        while not self._abandon.is_set():
            child = self._connected_child()
            if child is None:
                self._abandon.wait(0.05)
                continue
            with self._lock:
                room = child is self._child and self._held() + n <= self.maxsize
                if room:  # counted before the write: the child's reports may come before the write returns
                    self._shipped += n
                    self._writing = n
                    self._in_hand = 0
            if not room:  # the child holds its bound (Redis is down?): the bridge's queue takes the rest
                self._abandon.wait(0.05)
                continue
            assert child.stdin is not None
            try:
                child.stdin.write(data)
                child.stdin.flush()
            except (OSError, ValueError):  # the child is gone: this frame never reached it whole
                with self._lock:
                    self._in_hand = n
                    if child is self._child:
                        self._shipped -= n
                        self._writing = 0
                self._reap(wait_s=5)
                continue
            with self._lock:
                shipped = child is self._child
                if shipped:
                    self._writing = 0
            if shipped:
                if self.tick is not None:
                    self.tick()  # under load there is no idle time to do it in
                return
            # The child exited while the frame went into its pipe, and was settled without it.
            self._drop(n, f"the recording process exited holding {n} records")
            return
        self._in_hand = 0
        self._drop(n, f"{n} records abandoned at close")

    def _idle(self) -> None:
        self._connected_child()
        if self.tick is not None:
            self.tick()

    def close(self, timeout: float = 10.0) -> bool:
        """Ship what is queued, then let the child flush and exit; False when that took more than ``timeout``
        (the child is then stopped, and what it held is counted as dropped) or the child could not write
        everything."""
        self._deadline = time.monotonic() + timeout
        flushed = super().close(timeout)
        child = self._child
        if child is None:
            return flushed and self._clean
        if child.poll() is None:
            log.error("the recording process did not flush in %.0f s; stopping it", timeout)
            child.kill()
        if self._thread is not None:
            self._thread.join(5)
        self._reap(wait_s=5)
        self._log_totals()
        return False

    def _finish(self) -> None:
        """The queue is shipped: tell the child the time left, close its stdin, wait for it to exit."""
        child = self._child
        if child is None:
            return
        left = self._deadline - time.monotonic()
        assert child.stdin is not None
        with contextlib.suppress(OSError, ValueError):
            # The child's close can take its own time plus a last backoff and a second to give up.
            child.stdin.write(control({"close_s": max(0.1, left - self.max_backoff_s - 2)}))
            child.stdin.flush()
        with contextlib.suppress(OSError):
            child.stdin.close()
        if self._reap(wait_s=max(0.01, left)):
            self._clean = self._exit_code == 0


def _stop(child: subprocess.Popen[bytes]) -> int:
    """Wait for a child that is failing anyway (5 s, then kill it); its exit code. Closes its pipes."""
    _close_pipes(child)
    try:
        return child.wait(5)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


def _close_pipes(child: subprocess.Popen[bytes]) -> None:
    for pipe in (child.stdin, child.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
