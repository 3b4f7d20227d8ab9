"""The bus's clock: Redis's TIME plus the monotonic time since the sample, never this machine's wall clock."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from examlops.bus.clock import RedisClock, refresh, resync
from examlops.core.errors import StoreUnavailable


class FakeRedis:
    """A Redis port that answers TIME with ``now`` (None: unreachable) and counts the reads."""

    def __init__(self, now: float | None) -> None:
        self.now = now
        self.reads = 0

    async def execute(self, *args: Any) -> Any:
        assert args == ("TIME",)
        self.reads += 1
        if self.now is None:
            raise StoreUnavailable("Redis cannot be reached (TIME)")
        seconds = int(self.now)
        return [str(seconds).encode(), str(round((self.now - seconds) * 1_000_000)).encode()]


class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def clock_of(redis: FakeRedis, ticks: Ticks, wall: float = 5_000.0) -> RedisClock:
    return RedisClock(redis, every_s=60.0, retry_s=5.0, monotonic=ticks, wall=lambda: wall)  # type: ignore[arg-type]  # a fake port


async def test_it_is_redis_time_plus_the_monotonic_time_since_the_sample_whatever_the_wall_clock() -> None:
    redis, ticks = FakeRedis(1_700_000_000.25), Ticks()
    clock = clock_of(redis, ticks, wall=1_700_003_600.0)  # this machine's wall clock is an hour ahead
    assert await clock.sync() and clock.synced
    assert clock() == pytest.approx(1_700_000_000.25)
    ticks.now += 12.5
    assert clock() == pytest.approx(1_700_000_012.75)


class SlowRedis(FakeRedis):
    """Takes ``rtt`` of the test's monotonic time to answer, reading its time halfway."""

    def __init__(self, now: float, ticks: Ticks, rtt: float) -> None:
        super().__init__(now)
        self.ticks, self.rtt = ticks, rtt

    async def execute(self, *args: Any) -> Any:
        self.ticks.now += self.rtt / 2
        reply = await super().execute(*args)
        self.ticks.now += self.rtt / 2
        return reply


@pytest.mark.parametrize(("errs", "lean"), [("behind", -1.0), ("ahead", 1.0)])
async def test_a_samples_round_trip_errs_the_way_asked(errs: str, lean: float) -> None:
    ticks = Ticks()
    redis = SlowRedis(1_700_000_000.0, ticks, rtt=0.2)  # Redis's time is 1_700_000_000.0 at ticks 100.1
    clock = RedisClock(redis, errs=errs, monotonic=ticks, wall=lambda: 0.0)  # type: ignore[arg-type]  # fakes
    await clock.sync()
    assert clock() - 1_700_000_000.1 == pytest.approx(lean * 0.1, abs=1e-4)  # true time now (ticks 100.2): ...000.1


async def test_it_samples_again_only_once_a_minute_or_when_asked() -> None:
    redis, ticks = FakeRedis(1_700_000_000.0), Ticks()
    clock = clock_of(redis, ticks)
    await refresh(clock)
    assert redis.reads == 1
    ticks.now += 59.0
    redis.now = 1_700_000_059.5  # Redis's clock drifted half a second from this machine's monotonic one
    await refresh(clock)
    assert redis.reads == 1 and clock() == pytest.approx(1_700_000_059.0)
    ticks.now += 1.0
    redis.now = 1_700_000_060.5
    await refresh(clock)
    assert redis.reads == 2 and clock() == pytest.approx(1_700_000_060.5)
    resync(clock)
    await refresh(clock)
    assert redis.reads == 3


async def test_a_failed_read_keeps_the_last_anchor_logs_once_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    redis, ticks = FakeRedis(1_700_000_000.0), Ticks()
    clock = clock_of(redis, ticks)
    await clock.sync()
    redis.now = None
    caplog.set_level(logging.WARNING, "examlops.bus.clock")
    ticks.now += 61.0
    await refresh(clock)
    assert clock() == pytest.approx(1_700_000_061.0)
    ticks.now += 1.0
    await refresh(clock)  # within the retry wait: not asked again
    assert redis.reads == 2
    ticks.now += 5.0
    assert not await clock.sync()
    assert len([r for r in caplog.records if "TIME" in r.getMessage()]) == 1
    redis.now = 1_700_000_067.0
    ticks.now += 5.0
    await refresh(clock)
    assert clock() == pytest.approx(1_700_000_067.0)


async def test_before_any_read_it_is_this_machines_wall_clock() -> None:
    redis, ticks = FakeRedis(None), Ticks()
    clock = clock_of(redis, ticks, wall=5_000.0)
    await refresh(clock)
    assert not clock.synced and clock() == pytest.approx(5_000.0)
    ticks.now += 2.0
    assert clock() == pytest.approx(5_002.0)


async def test_an_injected_plain_clock_is_left_alone() -> None:
    await refresh(lambda: 1.0)
    resync(lambda: 1.0)
