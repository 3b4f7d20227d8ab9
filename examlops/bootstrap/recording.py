"""Recording's assemblies: the recorder that drains the records stream, and the child a bridge runs it in.

- ``RecordingProcess(settings, consumer)``: one recorder (``monitoring.recording``) on the settings'
  Redis, writing snapshots, audit events and failure windows; ``run()`` until ``close()`` (thread- and
  signal-safe), then it drains and checkpoints. `exa bridge recorder` runs it in the foreground.
- ``RecordingChild(settings, consumer)``: a bridge's recording child (``core.children``): ``start()``
  spawns it with multiprocessing; it reads its settings from its own environment (the bridge's, inherited;
  it refuses to run when they differ from the bridge's, checked by digest, so no secret crosses a pipe),
  lowers itself to ``settings.recording.nice`` once connected, and is started again when it dies or goes
  silent. ``close(timeout)`` asks it to drain and stop (a shared flag: it ignores SIGTERM and SIGINT, which
  reach the bridge's whole process group), then kills it after ``timeout``; it also exits when its bridge
  dies (the records it held are reclaimed by another recorder).
- ``bridge_recording(settings, consumer)``: the child and the retrain outbox's delivery, for a bridge.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.process import BaseProcess

from examlops.bootstrap.control import audit_trail
from examlops.core import children
from examlops.core.errors import ConfigError, StoreUnavailable
from examlops.core.settings import Settings

log = logging.getLogger(__name__)

SUPERVISE_S = 1.0
"""How often the bridge checks its recording child (and ticks its own audit checkpoints)."""
DRAIN_S = 5.0
"""How long a stopping recorder keeps writing what is left; its bridge waits 10 s for it."""
SILENCE_S = 60.0
"""A child whose heartbeat stopped this long is taken for stuck, killed and started again."""


class RecordingProcess:
    """One recorder draining the records stream as ``consumer``; built on ``run()``."""

    def __init__(self, settings: Settings, consumer: str, *, beat: Callable[[], None] = lambda: None) -> None:
        self.settings = settings
        self.consumer = consumer
        self.beat = beat
        self._stop = threading.Event()

    def run(self) -> None:
        from examlops.adapters.redis import translated
        from examlops.monitoring.failure_store import RedisFailureStore
        from examlops.monitoring.failures import FailureTracker
        from examlops.monitoring.recording import AuditRecordSink, Recorder, RedisRecordStream

        recording = self.settings.recording
        with audit_trail(self.settings) as trail:
            recorder = Recorder(
                RedisRecordStream(trail.redis, settled_keep_s=3 * recording.reclaim_idle_s),
                AuditRecordSink(trail, FailureTracker(RedisFailureStore(trail.redis), self.settings.failure)),
                self.consumer,
                batch=recording.batch,
                linger_s=recording.linger_s,
                reclaim_idle_s=recording.reclaim_idle_s,
                drain_s=DRAIN_S,
                beat=self.beat,
            )
            try:
                with translated("connecting"):
                    trail.redis.ping()  # connect while still at normal priority
            except StoreUnavailable as exc:
                log.warning("recorder %s: %s; waiting for it", self.consumer, exc)
            children.lower_priority(recording.nice)
            recorder.run(self._stop)

    def close(self) -> None:
        """Ask ``run()`` to drain and return (thread-safe and signal-safe)."""
        self._stop.set()


def settings_digest(settings: Settings) -> str:
    """A digest of the settings a recorder reads (Redis, SQL, the secret, recording, audit and failure sections):
    the child compares its own with its bridge's. Settings the child does not read may differ (a CLI flag's)."""
    parts = [settings.redis_url, settings.sql_url, settings.secret.get_secret_value()]
    parts += [section.model_dump_json() for section in (settings.recording, settings.audit, settings.failure)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


MISMATCH = (
    "the recording child's environment gives other Redis, SQL, secret, recording, audit or failure settings "
    "than its bridge's: give the bridge those settings through EXAMLOPS_* variables"
)


def child_main(consumer: str, stop: children.Flag, heartbeat: children.Heartbeat, log_level: int, digest: str) -> None:
    """The recording child's entry (multiprocessing): settings from the environment, then the recorder.

    It stops when ``stop`` is set (by its bridge, once the bridge has written its last records) or when its
    bridge dies; it ignores SIGINT and SIGTERM, which reach its whole process group (Ctrl-C, `exa down`),
    so that it does not stop before its bridge.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    heartbeat.beat()
    children.exit_with_parent(os.getppid())
    settings = Settings()
    if settings_digest(settings) != digest:
        raise ConfigError(MISMATCH)
    process = RecordingProcess(settings, consumer, beat=heartbeat.beat)

    def stop_when_asked() -> None:
        stop.wait()
        process.close()

    threading.Thread(target=stop_when_asked, name="stop-watch", daemon=True).start()
    process.run()


class RecordingChild:
    """A bridge's recording child, kept alive by a supervision thread; the module docstring states the contract."""

    def __init__(self, settings: Settings, consumer: str, *, tick: Callable[[], None] = lambda: None) -> None:
        self.settings = settings
        self.consumer = consumer
        self.tick = tick
        self._heartbeat = children.Heartbeat()
        self._child_stop = children.Flag()
        self._kept = children.KeptAlive(
            self._spawn, name="recording child", heartbeat=self._heartbeat.last, silence_s=SILENCE_S
        )
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        process = self._kept.process
        return None if process is None else process.pid

    @property
    def restarts(self) -> int:
        return self._kept.restarts

    def start(self) -> RecordingChild:
        """Start the child under supervision. Raises ``ConfigError`` at once (rather than a child that fails at
        every restart) when the environment the child inherits gives other settings than the bridge's."""
        if settings_digest(Settings()) != settings_digest(self.settings):
            raise ConfigError(MISMATCH)
        self._check()
        self._thread = threading.Thread(target=self._supervise, name="examlops-recording-child", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> bool:
        """Stop supervising, ask the child to drain and exit; True when it exited by itself within ``timeout``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            process = self._kept.process
            self._kept.process = None
        if process is None:
            return True
        assert isinstance(process, BaseProcess), "KeptAlive holds what _spawn started"
        self._child_stop.set()
        code = children.stop_child(process, timeout, ask=False)
        if code != 0:
            log.error("the recording child did not stop cleanly (code %s)", code)
        return code == 0

    def _spawn(self) -> BaseProcess:
        level = logging.getLogger().getEffectiveLevel()
        args = (self.consumer, self._child_stop, self._heartbeat, level, settings_digest(self.settings))
        process = children.start_child(child_main, args, name="examlops-recorder")
        log.info("recording child %s started (consumer %s)", process.pid, self.consumer)
        return process

    def _check(self) -> None:
        with self._lock:
            if not self._stop.is_set():
                self._kept.check()

    def _supervise(self) -> None:
        while not self._stop.wait(SUPERVISE_S):
            self._check()
            try:
                self.tick()
            except Exception:
                log.exception("the bridge's audit checkpoint failed")


@contextmanager
def bridge_recording(settings: Settings, consumer: str) -> Iterator[RecordingChild]:
    """A bridge's recording: its child (records), and the retrain outbox delivered to Prefect by a thread.

    Both are stopped on exit, the child after draining what the bridge recorded.
    """
    from examlops.monitoring.retrain import OutboxDelivery, PrefectRetrainRequester, RedisOutbox

    with audit_trail(settings) as trail:
        child = RecordingChild(settings, consumer, tick=trail.tick).start()  # the bridge's own events get signed
        delivery = OutboxDelivery(RedisOutbox(trail.redis), PrefectRetrainRequester(settings.prefect_api_url), trail)
        delivery.start()
        try:
            yield child
        finally:
            child.close(10)
            delivery.close()
