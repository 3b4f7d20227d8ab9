"""The micro-batcher's waiting items and the two timing rules a batch is formed by (``serving.batcher``).

- ``Waiter``: one submitted item, its future and its ``due`` (loop time; ``math.inf``: no deadline),
  ordered by ``key``, then arrival (``seq``): each heap of ``serving.queues`` takes the earliest key first.
- ``InFlight``: a batch being handled, when it was handed over and its items (the admission estimate
  reads it).
- ``flush_time``: when a batch must go, ``max_wait_s`` after it opened or earlier for its tightest ``due``
  (less the handling time ``lead`` expects); never later than ``max_wait_s``.
- ``fits``: whether one more item can join a batch without the batch's expected handling time running past
  its tightest ``due``; always True without ``lead`` or without any deadline.
- ``hopeless``: whether an item's ``due`` comes before a batch of it alone would be handled.
- ``fail_all``: fails every waiter not yet answered with one error; an answered one is left as it is.

Pure: no loop, no task; the futures are the batcher's, created on its running loop.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")
Lead = Callable[[Sequence[T]], float]
"""The handling time a batch of these items is expected to take, in seconds."""


@dataclass(slots=True, order=True)
class Waiter(Generic[T, R]):
    """One submitted item in the queue: ordered by ``key``, then arrival (``seq``)."""

    key: float
    seq: int
    item: T = field(compare=False)
    future: asyncio.Future[R] = field(compare=False)
    due: float = field(default=math.inf, compare=False)
    """Loop time after which nobody waits for the answer (``math.inf``: no deadline)."""


@dataclass(slots=True)
class InFlight(Generic[T]):
    """A batch being handled: when it was handed over and its items (what the admission estimate reads)."""

    started: float
    items: list[T]
    expected_ms: dict[str, float] = field(default_factory=dict)
    """The admission estimate's memo: the batch's expected predict time, per model asked for (``""``: all)."""


def fail_all(waiters: Sequence[Waiter[Any, Any]], error: BaseException) -> None:
    """Fail every waiter not answered yet with ``error``."""
    for waiter in waiters:
        if not waiter.future.done():
            waiter.future.set_exception(error)


def flush_time(batch: list[Waiter[T, Any]], opened: float, max_wait_s: float, lead: Lead[T] | None) -> float:
    """When the batch must go: ``max_wait_s`` after it opened, or earlier for its tightest deadline."""
    flush_at = opened + max_wait_s
    tightest = min(waiter.due for waiter in batch)
    if tightest < flush_at:
        expected = lead([waiter.item for waiter in batch]) if lead is not None else 0.0
        flush_at = min(flush_at, tightest - expected)
    return flush_at


def fits(batch: list[Waiter[T, Any]], waiter: Waiter[T, Any], now: float, lead: Lead[T] | None) -> bool:
    """Whether ``batch`` with ``waiter`` in it can still be handled before its tightest deadline."""
    tightest = min(waiter.due, min(member.due for member in batch))
    if tightest == math.inf or lead is None:
        return True
    return now + lead([*(member.item for member in batch), waiter.item]) <= tightest


def hopeless(waiter: Waiter[T, Any], now: float, lead: Lead[T] | None) -> bool:
    """Whether ``waiter``'s ``due`` comes before a batch of it alone, handed over ``now``, would be handled."""
    return lead is not None and waiter.due < math.inf and now + lead([waiter.item]) > waiter.due
