"""The bridge's recording: the recorder (a child process or a thread), the retrain outbox's delivery."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, BinaryIO

from examlops.bootstrap.control import audit_trail
from examlops.core.settings import Settings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from examlops.monitoring.audit import AuditTrail
    from examlops.monitoring.recorder import Backlog, Recorder, Tuning


def settings_json(settings: Settings) -> str:
    """The settings as JSON that ``Settings.model_validate_json`` reads back whole, the secret included."""
    import json

    data = settings.model_dump(mode="json")
    data["secret"] = settings.secret.get_secret_value()
    return json.dumps(data)


def recording_process_argv() -> list[str]:
    """`exa bridge recorder`, logging at the level of this process's root logger."""
    import logging

    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
    return [sys.executable, "-m", "examlops.cli.main", "bridge", "recorder", "--log-level", level]


@contextmanager
def bridge_recording(settings: Settings, metrics: CollectorRegistry | None = None) -> Iterator[Backlog]:
    """What the bridge records through: snapshots, audit events, the failure windows and retrain requests.

    The records are written by a child process at a low CPU priority (``settings.recording``; see
    ``monitoring.recorder_process``), or by a thread of the bridge; retrain requests go through a Redis
    outbox delivered to the Prefect deployment `retrain/retrain` by another thread. Both are flushed and
    stopped on exit.
    """
    from examlops.monitoring.recorder_process import RecorderProcess
    from examlops.monitoring.retrain import OutboxDelivery, PrefectRetrainRequester, RedisOutbox

    with audit_trail(settings) as trail:
        recorder: Backlog
        if settings.recording.process:
            recorder = RecorderProcess(
                recording_process_argv(),
                settings_json(settings),
                nice=settings.recording.nice,
                tick=trail.tick,  # the bridge's own events (retrain requests) get checkpointed
                registry=metrics,
            ).start()
        else:
            recorder = redis_recorder(settings, trail, registry=metrics).start()
        delivery = OutboxDelivery(RedisOutbox(trail.redis), PrefectRetrainRequester(settings.prefect_api_url), trail)
        delivery.start()
        try:
            yield recorder
        finally:
            recorder.close(10)
            delivery.close()


def redis_recorder(
    settings: Settings, trail: AuditTrail, tuning: Tuning | None = None, *, registry: CollectorRegistry | None = None
) -> Recorder:
    """The recorder that writes to Redis (snapshots, audit events, failure windows), not yet started."""
    from examlops.monitoring.failure_store import RedisFailureStore
    from examlops.monitoring.failures import FailureTracker
    from examlops.monitoring.recorder import DEFAULT_TUNING, Recorder

    tracker = FailureTracker(RedisFailureStore(trail.redis), settings.failure)
    return Recorder(trail, tracker, tuning or DEFAULT_TUNING, registry=registry)


def run_recording_process(frames: BinaryIO, reports: BinaryIO) -> bool:
    """The recording process (``exa bridge recorder``): the hello frame's settings, then ``serve`` until EOF.

    Returns False when records were left unwritten.
    """
    from examlops.monitoring.recorder_process import ignore_stop_signals, lower_priority, read_hello, serve

    ignore_stop_signals()
    hello = read_hello(frames)
    if hello is None:
        return True  # the bridge went away before saying anything
    settings = Settings.model_validate_json(hello.config)
    with audit_trail(settings) as trail:
        recorder = redis_recorder(settings, trail, hello.tuning)
        lower_priority(hello.nice)
        return serve(recorder.start(), frames, reports)
