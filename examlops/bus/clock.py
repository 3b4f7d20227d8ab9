"""The bus's one clock: Redis's ``TIME``, shared by every client and bridge of one bus (``RedisClock``).

Contract:

- ``clock()`` does no I/O: Redis's time at the last sample plus the monotonic time since it, so a step or
  a skew of this machine's wall clock changes nothing; between samples it runs at this machine's monotonic
  rate, and a new sample moves it by that drift only (milliseconds a minute).
- ``await clock.refresh()`` samples ``TIME`` when the last sample is ``every_s`` (60 s) old or a resync
  was asked (``resync()``: after a Redis outage, which may have been a restart elsewhere); one read at a
  time. ``await clock.sync()`` samples now. The bridge refreshes at start and on each sweep, the client
  before each job.
- ``errs`` says which way a sample's error (Redis read its time somewhere within the round trip) goes:
  ``"behind"`` (the client's: never later than Redis's time, so a deadline it sets is never later than
  meant) or ``"ahead"`` (the bridge's: never earlier, so it never finds more time left than there is).
  Between the two, on one machine, a job's budget only tightens, whatever the round trips.
- A failed read keeps the last anchor, is logged once per outage and retried after ``retry_s``; it never
  raises. Before the first good read the anchor is this machine's wall clock.

Why: a job's deadline is absolute, set by the client and judged by the bridges; on one shared clock a
client's or bridge's wall-clock skew or step can no longer drop or mis-time jobs (tests/faults, clock step).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Literal

from examlops.adapters.redis import RedisCommands

log = logging.getLogger(__name__)

SAMPLE_EVERY_S = 60.0
"""How often ``refresh`` reads Redis's TIME again."""
RETRY_S = 5.0
"""After a failed read, how long ``refresh`` waits before it tries again."""


class RedisClock:
    """Redis's wall clock, read without I/O between samples (contract above). Callable: ``clock() -> float``."""

    def __init__(
        self,
        redis: RedisCommands,
        *,
        every_s: float = SAMPLE_EVERY_S,
        retry_s: float = RETRY_S,
        errs: Literal["behind", "ahead"] = "ahead",
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.redis = redis
        self.every_s = every_s
        self.retry_s = retry_s
        self.errs = errs
        self._monotonic = monotonic
        mono = monotonic()
        self._anchor = (wall(), mono)  # (Redis time, monotonic time) of the last sample
        self.synced = False
        """Whether the anchor is Redis's (a read succeeded) rather than this machine's wall clock."""
        self._next = mono  # the first refresh samples
        self._reading = False
        self._failing = False

    def __call__(self) -> float:
        redis_time, mono = self._anchor
        return redis_time + (self._monotonic() - mono)

    def resync(self) -> None:
        """Have the next ``refresh`` sample, whatever the last sample's age."""
        self._next = self._monotonic()

    async def refresh(self) -> None:
        """Sample when due (``every_s``, a resync, or ``retry_s`` after a failure); never raises."""
        if not self._reading and self._monotonic() >= self._next:
            await self.sync()

    async def sync(self) -> bool:
        """Sample Redis's TIME now; whether it was read. A failure keeps the anchor, logged once per outage."""
        self._reading = True
        try:
            before = self._monotonic()
            reply = await self.redis.execute("TIME")
            after = self._monotonic()
            redis_time = _seconds(reply)
        except Exception as exc:  # a lost Redis, a refused command, an odd reply: the job path goes on
            self._next = self._monotonic() + self.retry_s
            if not self._failing:
                self._failing = True
                log.warning("the bus clock could not read Redis's TIME (%s); it keeps its last anchor", exc)
            return False
        finally:
            self._reading = False
        # Redis read its time between sending and receiving: anchored at the receipt, the clock never reads
        # later than Redis's time; at the sending, never earlier.
        self._anchor = (redis_time, after if self.errs == "behind" else before)
        self._next = after + self.every_s
        self.synced = True
        if self._failing:
            self._failing = False
            log.info("the bus clock reads Redis's TIME again")
        return True


def _seconds(reply: Any) -> float:
    """Redis's ``TIME`` reply (``[seconds, microseconds]``, as bytes or text) in seconds."""
    seconds, micros = reply
    if isinstance(seconds, bytes):
        seconds, micros = seconds.decode(), micros.decode()
    return int(seconds) + int(micros) / 1_000_000.0


async def refresh(clock: Callable[[], float]) -> None:
    """``clock.refresh()`` for a ``RedisClock``; nothing for another clock (an injected one, in tests)."""
    if isinstance(clock, RedisClock):
        await clock.refresh()


def resync(clock: Callable[[], float]) -> None:
    """``clock.resync()`` for a ``RedisClock``; nothing for another clock."""
    if isinstance(clock, RedisClock):
        clock.resync()
