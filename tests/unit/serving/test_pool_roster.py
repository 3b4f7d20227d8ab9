"""The predict pool's roster: which worker takes the next call, and who stands in for a lost one.

Workers here are real ``pool_workers.Worker`` records around an unstarted process and an unused pipe:
the roster reads only what a worker holds (pending calls, retired), never its process.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection

import pytest

from examlops.core.errors import PipelineUnavailable
from examlops.serving.pool_roster import Roster
from examlops.serving.pool_workers import Worker

MakeWorker = Callable[[], Worker]


@pytest.fixture
def make_worker() -> Iterator[MakeWorker]:
    ends: list[Connection] = []

    def make() -> Worker:
        here, there = multiprocessing.Pipe()
        ends.extend((here, there))
        return Worker(multiprocessing.get_context("spawn").Process(), here)

    yield make
    for end in ends:
        end.close()


def roster_of(make_worker: MakeWorker, active: int) -> Roster:
    roster = Roster()
    roster.active = [make_worker() for _ in range(active)]
    roster.spare = make_worker()
    return roster


async def test_callers_waiting_for_a_worker_are_served_first_come_first_served(make_worker: MakeWorker) -> None:
    roster = roster_of(make_worker, 2)
    first, second = roster.active
    callers = [asyncio.create_task(roster.acquire()) for _ in range(3)]
    await asyncio.sleep(0)
    roster.release(second)
    roster.release(first)
    await asyncio.sleep(0)
    assert [c.done() for c in callers] == [True, True, False]
    assert [callers[0].result(), callers[1].result()] == [second, first]
    callers[2].cancel()


async def test_an_idle_worker_is_taken_at_once_and_the_spare_is_never_handed_out(make_worker: MakeWorker) -> None:
    roster = roster_of(make_worker, 1)
    assert roster.spare is not None
    roster.release(roster.spare)
    roster.release(roster.active[0])
    roster.release(roster.active[0])  # already idle: not queued twice
    assert await roster.acquire() is roster.active[0]
    waiting = asyncio.create_task(roster.acquire())
    await asyncio.sleep(0)
    assert not waiting.done()
    waiting.cancel()


async def test_a_caller_cancelled_as_a_worker_reaches_it_gives_the_worker_to_the_next(make_worker: MakeWorker) -> None:
    roster = roster_of(make_worker, 1)
    worker = roster.active[0]
    gone, next_one = asyncio.create_task(roster.acquire()), asyncio.create_task(roster.acquire())
    await asyncio.sleep(0)
    roster.release(worker)  # handed to the first caller ...
    gone.cancel()  # ... which gives up before it runs
    await asyncio.sleep(0)
    assert gone.cancelled()
    assert await next_one is worker


async def test_a_busy_or_retired_worker_is_not_released(make_worker: MakeWorker) -> None:
    roster = roster_of(make_worker, 2)
    busy, retired = roster.active
    busy.pending[1] = asyncio.get_running_loop().create_future()
    retired.retired = True
    roster.release(busy)
    roster.release(retired)
    waiting = asyncio.create_task(roster.acquire())
    await asyncio.sleep(0)
    assert not waiting.done()
    waiting.cancel()
    busy.pending[1].cancel()


async def test_a_lost_worker_is_replaced_by_the_spare_and_a_new_spare_is_spawned(make_worker: MakeWorker) -> None:
    roster = roster_of(make_worker, 2)
    lost, kept = roster.active
    spare = roster.spare
    fresh = make_worker()
    waiting = asyncio.create_task(roster.acquire())
    await asyncio.sleep(0)
    roster.replace(lost, lambda: fresh)
    assert roster.active == [kept, spare]
    assert roster.spare is fresh
    assert await waiting is spare
    roster.replace(fresh, make_worker)  # a lost spare: only a new spare
    assert roster.active == [kept, spare] and roster.spare not in (None, fresh)


async def test_clearing_returns_every_worker_and_fails_each_waiter_with_its_own_error(make_worker: MakeWorker) -> None:
    roster = roster_of(make_worker, 1)
    held = roster.workers()
    callers = [asyncio.create_task(roster.acquire()) for _ in range(2)]
    await asyncio.sleep(0)
    assert roster.clear() == held
    roster.fail_waiters(lambda: PipelineUnavailable("the predict pool is closed"))
    errors = await asyncio.gather(*callers, return_exceptions=True)
    assert all(isinstance(e, PipelineUnavailable) for e in errors)
    assert errors[0] is not errors[1]
    assert roster.workers() == [] and roster.busy() == 0
