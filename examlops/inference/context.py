"""The ambient call context: a deadline, a criticality and a trace id that nested calls inherit.

Held in context variables, so an ``async`` task started inside a ``deadline_in`` block carries the same
deadline. Deadlines only tighten: ``deadline_in`` binds the earlier of the given timeout and the deadline
already in force, never a later one. Times are ``time.monotonic()`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from enum import IntEnum


class Criticality(IntEnum):
    """How much a call matters when the backend is short: lower sheds first."""

    BEST_EFFORT = 0
    DEFAULT = 1
    CRITICAL = 2


_deadline: ContextVar[float | None] = ContextVar("examlops_inference_deadline", default=None)
_criticality: ContextVar[Criticality] = ContextVar("examlops_inference_criticality", default=Criticality.DEFAULT)
_trace_id: ContextVar[str | None] = ContextVar("examlops_inference_trace_id", default=None)


def seconds(timeout: timedelta | float) -> float:
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)


def current_deadline() -> float | None:
    """The deadline in force (monotonic seconds), or None."""
    return _deadline.get()


def tightened(timeout: timedelta | float | None, now: float | None = None) -> float | None:
    """The earlier of ``now + timeout`` and the deadline in force; the deadline in force when no timeout."""
    ambient = _deadline.get()
    if timeout is None:
        return ambient
    own = (time.monotonic() if now is None else now) + seconds(timeout)
    return own if ambient is None else min(own, ambient)


@contextmanager
def deadline_in(timeout: timedelta | float) -> Iterator[float]:
    """Bind a deadline ``timeout`` from now for the block (never later than the one already in force)."""
    deadline = tightened(timeout)
    assert deadline is not None
    token = _deadline.set(deadline)
    try:
        yield deadline
    finally:
        _deadline.reset(token)


def current_criticality() -> Criticality:
    return _criticality.get()


@contextmanager
def bind_criticality(criticality: Criticality) -> Iterator[None]:
    """Calls made in the block carry ``criticality`` (shed order when the backend throttles)."""
    token = _criticality.set(criticality)
    try:
        yield
    finally:
        _criticality.reset(token)


def current_trace_id() -> str | None:
    return _trace_id.get()


@contextmanager
def bind_trace_id(trace_id: str) -> Iterator[None]:
    """Calls made in the block carry ``trace_id`` to backends that take one (examlops' routes)."""
    token = _trace_id.set(trace_id)
    try:
        yield
    finally:
        _trace_id.reset(token)
