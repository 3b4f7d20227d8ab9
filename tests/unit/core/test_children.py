"""Keeping one child alive: started again after it exits or goes silent, with a delay that doubles."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from examlops.core.backoff import Backoff
from examlops.core.children import KeptAlive
from tests.unit.monitoring.fakes import Clock


@dataclass
class FakeProcess:
    pid: int
    exitcode: int | None = None
    killed: bool = False
    closed: bool = False

    def kill(self) -> None:
        self.killed = True
        self.exitcode = -9

    def close(self) -> None:
        self.closed = True


@dataclass
class Starter:
    started: list[FakeProcess] = field(default_factory=list)
    failing: bool = False

    def __call__(self) -> FakeProcess:
        if self.failing:
            raise OSError("no more processes")
        process = FakeProcess(100 + len(self.started))
        self.started.append(process)
        return process


def kept(starter: Starter, clock: Clock, beat: list[float] | None = None) -> KeptAlive:
    heartbeat = (lambda: beat[0]) if beat is not None else None
    return KeptAlive(
        starter, name="child", heartbeat=heartbeat, silence_s=10, restart=Backoff(1.0, 8.0), stable_s=30, clock=clock
    )


def test_a_child_that_keeps_dying_young_is_started_again_after_a_doubling_delay() -> None:
    clock, starter = Clock(), Starter()
    supervisor = kept(starter, clock)
    assert supervisor.check() is starter.started[0]
    starts = [clock.now]
    for _ in range(4):
        starter.started[-1].exitcode = 1
        count = len(starter.started)
        supervisor.check()
        while len(starter.started) == count:
            clock.advance(0.5)
            supervisor.check()
        starts.append(clock.now)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps == [1.0, 2.0, 4.0, 8.0]
    assert supervisor.restarts == 4 and all(p.closed for p in starter.started[:-1])


def test_a_child_that_lived_long_enough_is_started_again_after_the_first_delay() -> None:
    clock, starter = Clock(), Starter()
    supervisor = kept(starter, clock)
    supervisor.check()
    starter.started[0].exitcode = 1
    supervisor.check()
    clock.advance(1.0)
    supervisor.check()
    clock.advance(60)  # the second one lived long: the delay starts over
    starter.started[1].exitcode = -9
    supervisor.check()
    clock.advance(0.99)
    assert supervisor.check() is None
    clock.advance(0.01)
    assert supervisor.check() is starter.started[2]


def test_a_silent_child_is_killed_and_replaced_while_a_beating_one_is_left_alone() -> None:
    clock, starter, beat = Clock(), Starter(), [0.0]
    supervisor = kept(starter, clock, beat)
    supervisor.check()
    for _ in range(5):  # beating every 5 s
        clock.advance(5)
        beat[0] = clock.now
        supervisor.check()
    assert not starter.started[0].killed
    clock.advance(10.5)
    supervisor.check()
    assert starter.started[0].killed
    supervisor.check()  # reaped: started again after the first delay
    clock.advance(1.0)
    supervisor.check()
    assert len(starter.started) == 2 and supervisor.process is starter.started[1]


def test_a_child_that_cannot_start_is_tried_again_later() -> None:
    clock, starter = Clock(), Starter(failing=True)
    supervisor = kept(starter, clock)
    assert supervisor.check() is None
    starter.failing = False
    assert supervisor.check() is None, "not before the delay"
    clock.advance(1.0)
    assert supervisor.check() is starter.started[0]
