"""Hedging for one route: race a second attempt after the route's observed latency quantile.

A prediction is a pure read, so two attempts at once are safe; their cost is load (and money on a paid
endpoint), so hedges are capped by a budget.

Contract of ``Hedger.run(attempt, deadline)``:

- The attempt starts at once. If it has not answered after ``delay()`` (the ``quantile`` of the route's
  recent latencies, at least ``min_delay_s``; no hedging before ``min_samples`` latencies were seen), a
  second attempt starts, provided the budget allows one more hedge (at most ``budget_ratio`` extra calls
  over the last ``budget_window_s``) and the deadline leaves time for it.
- The first attempt to succeed wins and the other is cancelled (and awaited, so nothing leaks). A failure
  while the other attempt is still running waits for that one; when both fail the primary's error is
  raised. A failure before any hedge started is raised at once (retrying is the caller's business).
- Cancelling ``run`` cancels both attempts.

Latencies come from every attempt that answered; an attempt cancelled because it lost adds the time it had
run, a lower bound of its latency, so a slow tail that hedging hides still weighs on the estimate.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

from examlops.inference.resilience.policy import HedgePolicy
from examlops.inference.resilience.quantile import SlidingQuantile

T = TypeVar("T")


class HedgeBudget:
    """At most ``ratio`` hedges per call over a sliding window of ``window_s`` seconds."""

    def __init__(self, ratio: float, window_s: float, clock: Callable[[], float]) -> None:
        self._ratio = ratio
        self._window_s = window_s
        self._clock = clock
        self._calls: deque[float] = deque()
        self._hedges: deque[float] = deque()

    def note_call(self) -> None:
        self._calls.append(self._clock())

    def try_spend(self) -> bool:
        """Take one hedge from the budget if it has one left."""
        horizon = self._clock() - self._window_s
        for seen in (self._calls, self._hedges):
            while seen and seen[0] < horizon:
                seen.popleft()
        if len(self._hedges) + 1 > self._ratio * len(self._calls):
            return False
        self._hedges.append(self._clock())
        return True


class Hedger:
    """The hedging of one route; see the module docstring."""

    def __init__(self, policy: HedgePolicy, clock: Callable[[], float]) -> None:
        self._policy = policy
        self._clock = clock
        self.latency = SlidingQuantile(policy.window)
        self.budget = HedgeBudget(policy.budget_ratio, policy.budget_window_s, clock)
        self.hedges = 0
        """Hedges started so far (for tests and metrics)."""

    def delay(self) -> float | None:
        """How long to wait before hedging, or None when not hedging (disabled, too few samples)."""
        if not self._policy.enabled or len(self.latency) < self._policy.min_samples:
            return None
        estimate = self.latency.quantile(self._policy.quantile)
        return None if estimate is None else max(self._policy.min_delay_s, estimate)

    async def run(self, attempt: Callable[[], Awaitable[T]], deadline: float | None) -> T:
        self.budget.note_call()
        delay = self.delay()
        if delay is None:
            return await self._timed(attempt)
        primary = asyncio.ensure_future(self._timed(attempt))
        tasks: set[asyncio.Future[T]] = {primary}
        try:
            done, _ = await asyncio.wait(tasks, timeout=delay)
            if done or not self._may_hedge(deadline):
                return await primary
            tasks.add(asyncio.ensure_future(self._timed(attempt)))
            self.hedges += 1
            return await _first_success(primary, tasks)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def _may_hedge(self, deadline: float | None) -> bool:
        if deadline is not None:
            typical = self.latency.quantile(0.5) or 0.0
            if self._clock() + typical >= deadline:
                return False  # a hedge that cannot answer in time only adds load
        return self.budget.try_spend()

    async def _timed(self, attempt: Callable[[], Awaitable[T]]) -> T:
        started = self._clock()
        try:
            result = await attempt()
        except asyncio.CancelledError:
            self.latency.add(self._clock() - started)
            raise
        self.latency.add(self._clock() - started)
        return result


async def _first_success(primary: asyncio.Future[T], tasks: set[asyncio.Future[T]]) -> T:
    pending = set(tasks)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task.exception() is None:
                return task.result()
    return primary.result()  # both failed: the primary's error
