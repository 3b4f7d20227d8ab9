"""``Tracer``: one call's trace from its arrival to its record, for serving's HTTP edge and the bridge.

``begin(...)`` opens a ``CallTrace`` (its id, channel, arrival time, and ``facts`` for the pipeline to
fill); whoever handles the call notes what it learns on it (model, alias, version, job id; identity and
task once those exist). ``finish(call, ...)`` turns it into one ``TraceRecord`` with the outcome, keeps
input and output by the payload policy, and hands it to the sink without waiting. ``finish`` is called
once per call; a second call for the same ``CallTrace`` records nothing. It never raises.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from examlops.core.messages import ServingFacts
from examlops.tracing.policy import PayloadPolicy
from examlops.tracing.record import Channel, TraceRecord, new_trace_id, outcome_of, valid_trace_id

log = logging.getLogger(__name__)


class TraceQueue(Protocol):
    """Where finished traces go (``TraceSink``): ``put`` never blocks, False when the trace was dropped."""

    def put(self, record: TraceRecord) -> bool: ...

    def start(self) -> None: ...

    def close(self, timeout_s: float = 10.0) -> None: ...


def default_node(configured: str = "") -> str:
    """The node name traces carry: the configured one, else ``hostname:pid``."""
    return configured or f"{socket.gethostname()}:{os.getpid()}"


@dataclass(slots=True)
class CallTrace:
    """One call in progress. Identity, task, adapter and budget stay None until the platform knows them."""

    trace_id: str
    channel: Channel
    at: float
    started: float
    facts: ServingFacts = field(default_factory=ServingFacts)
    model: str | None = None
    alias: str | None = None
    version: str | None = None
    identity: str | None = None
    task: str | None = None
    adapter: str | None = None
    budget_ms: float | None = None
    deadline: float | None = None
    """UNIX time the call's budget (or deadline) ends; the trace records what was left of it at the end."""
    job_id: str | None = None
    ended: str | None = None
    """A streamed call that answered 200 but stopped early: the code it stopped with (``refused`` when its
    budget ran out); the trace records that outcome instead of answered."""
    finished: bool = False


class Tracer:
    """Opens and finishes call traces (contract above). ``queue`` None: ids are given, nothing is stored."""

    def __init__(
        self,
        queue: TraceQueue | None,
        policy: PayloadPolicy | None = None,
        *,
        node: str = "",
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.queue = queue
        self.policy = policy or PayloadPolicy()
        self.node = default_node(node)
        self.wall = wall
        self.clock = clock

    def start(self) -> None:
        """Start writing traces (the queue's writer); idempotent."""
        if self.queue is not None:
            self.queue.start()

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued (at most ``timeout_s``) and stop; blocking."""
        if self.queue is not None:
            self.queue.close(timeout_s)

    def begin(self, channel: Channel = "http", trace_id: str | None = None) -> CallTrace:
        """A new call; ``trace_id`` is kept when it is one (a bridge's), else a fresh one is made."""
        given = trace_id if trace_id is not None and valid_trace_id(trace_id) else None
        return CallTrace(given or new_trace_id(), channel, self.wall(), self.clock())

    def finish(
        self,
        call: CallTrace,
        *,
        error_code: str | None,
        status: int = 0,
        input: bytes | object = None,
        output: bytes | object = None,
        verdict: bool = False,
    ) -> TraceRecord | None:
        """Record ``call``: answered when ``error_code`` is None, else refused or failed as the code says.

        ``input``/``output``: the call's request and reply (bytes of JSON, or a value), kept by the policy.
        ``verdict``: this outcome is what the caller got, over any other record of the call (a bridge's).
        Returns the record queued (None when already finished or tracing is off).
        """
        if call.finished:
            return None
        call.finished = True
        if self.queue is None:
            return None
        try:
            record = self._record(call, error_code, status, input, output, verdict)
            self.queue.put(record)
        except Exception:  # tracing never fails a call
            log.exception("the trace of call %s could not be built", call.trace_id)
            return None
        return record

    def _record(
        self,
        call: CallTrace,
        error_code: str | None,
        status: int,
        input: bytes | object,
        output: bytes | object,
        verdict: bool,
    ) -> TraceRecord:
        facts = call.facts
        keeps = self.policy.keeps
        deadline = call.deadline
        # Positional, in TraceRecord's field order: a call's record is built on its request path.
        return TraceRecord(
            call.trace_id,
            call.at,
            call.channel,
            outcome_of(error_code),
            error_code or "",
            call.model,
            call.alias or facts.alias,
            call.version or facts.version,
            call.adapter,
            call.identity,
            call.task,
            call.budget_ms,
            None if deadline is None else round((deadline - self.wall()) * 1000, 1),
            (self.clock() - call.started) * 1000,
            self.node,
            facts.batch_id,
            facts.batch_size,
            facts.queue_wait_ms,
            facts.predict_ms,
            status,
            call.job_id,
            self._kept(input) if keeps else "",
            self._kept(output) if keeps else "",
            verdict,
        )

    def _kept(self, value: bytes | object) -> str:
        return self.policy.kept_body(value) if isinstance(value, bytes) else self.policy.kept(value)
