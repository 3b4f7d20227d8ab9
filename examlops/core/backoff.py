"""Backoff for every retry and pacing loop: one schedule, and one note of an outage.

- ``Backoff(base_s, cap_s)``: the wait after the n-th consecutive failure is
  ``base_s * 2 ** (n - 1)``, at most ``cap_s``. Pure: the caller sleeps (or
  sets a timer on its own clock), so tests move time instead of waiting.
- ``Outage``: a loop's view of a dependency that went away. ``lost(exc)``
  logs the first failure once and returns the wait before the next try;
  ``back()`` logs the recovery once and resets the schedule.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential waits: ``base_s`` after the first failure, doubling, never above ``cap_s``."""

    base_s: float
    cap_s: float

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.cap_s:
            raise ValueError("a backoff needs 0 < base_s <= cap_s")

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` consecutive failures (0 for none)."""
        if failures <= 0:
            return 0.0
        return float(min(self.cap_s, self.base_s * 2 ** min(failures - 1, 62)))


RECONNECT = Backoff(0.1, 2.0)
"""The loops that wait for Redis to come back (bus reads, replies, the recorder)."""


class Outage:
    """Logs a lost dependency once and its return once, and paces the retries with a ``Backoff``."""

    def __init__(
        self,
        who: str,
        logger: logging.Logger = log,
        *,
        backoff: Backoff = RECONNECT,
        what: str = "Redis",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.who = who
        self.log = logger
        self.backoff = backoff
        self.what = what
        self.clock = clock
        self.since: float | None = None
        self.attempts = 0

    def lost(self, exc: BaseException) -> float:
        """Note one failure; the seconds to wait before the next try."""
        if self.since is None:
            self.since = self.clock()
            self.log.warning("%s: %s unreachable (%s); retrying with backoff", self.who, self.what, exc)
        self.attempts += 1
        return self.backoff.delay(self.attempts)

    def back(self) -> None:
        """Note a success: logs the recovery if there was an outage, and resets the schedule."""
        if self.since is not None:
            self.log.warning("%s: %s reachable again after %.1f s", self.who, self.what, self.clock() - self.since)
        self.since, self.attempts = None, 0
