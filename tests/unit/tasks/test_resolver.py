"""The task resolver: a snapshot of the whole map, fresh for the TTL, shared reads, kept when SQL is down."""

from __future__ import annotations

import asyncio

import pytest

from examlops.core.errors import StoreUnavailable, TaskNotFound
from examlops.tasks.resolver import TaskResolver
from tests.unit.tasks.fakes import InMemoryTaskMap


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def tasks() -> InMemoryTaskMap:
    tasks = InMemoryTaskMap()
    tasks.map("pavement.distress.jpcp", "JPCP", "Production")
    return tasks


async def test_a_remap_is_seen_once_the_ttl_has_passed_and_not_before(tasks: InMemoryTaskMap) -> None:
    clock = Clock()
    resolver = TaskResolver(tasks, ttl_s=30.0, clock=clock)
    assert (await resolver.resolve("pavement.distress.jpcp")).model == "JPCP"
    tasks.map("pavement.distress.jpcp", "CRCP", "Canary")
    clock.now += 29.0
    assert (await resolver.resolve("pavement.distress.jpcp")).model == "JPCP"
    clock.now += 1.0
    route = await resolver.resolve("pavement.distress.jpcp")
    assert (route.model, route.alias) == ("CRCP", "Canary")
    assert tasks.reads == 2


async def test_task_names_match_in_any_case(tasks: InMemoryTaskMap) -> None:
    resolver = TaskResolver(tasks, ttl_s=30.0, clock=Clock())
    assert (await resolver.resolve("Pavement.Distress.JPCP")).task == "pavement.distress.jpcp"


@pytest.mark.parametrize("name", ["pavement.distress.ac", "x" * 5000, "../etc", "", "a b"])
async def test_an_unknown_or_impossible_task_is_task_not_found_naming_a_short_prefix(
    tasks: InMemoryTaskMap, name: str
) -> None:
    resolver = TaskResolver(tasks, ttl_s=30.0, clock=Clock())
    with pytest.raises(TaskNotFound) as caught:
        await resolver.resolve(name)
    assert caught.value.code == "unknown_task"
    assert name[:64] in caught.value.message
    assert len(caught.value.message) < 200


async def test_unknown_names_cost_no_read_while_the_snapshot_is_fresh(tasks: InMemoryTaskMap) -> None:
    resolver = TaskResolver(tasks, ttl_s=30.0, clock=Clock())
    for n in range(100):
        with pytest.raises(TaskNotFound):
            await resolver.resolve(f"made.up.{n}")
    assert tasks.reads == 1


async def test_concurrent_calls_on_a_stale_snapshot_share_one_read(tasks: InMemoryTaskMap) -> None:
    resolver = TaskResolver(tasks, ttl_s=30.0, clock=Clock())
    routes = await asyncio.gather(*(resolver.resolve("pavement.distress.jpcp") for _ in range(20)))
    assert {r.model for r in routes} == {"JPCP"}
    assert tasks.reads == 1


async def test_the_last_snapshot_keeps_answering_while_the_store_is_down(tasks: InMemoryTaskMap) -> None:
    clock = Clock()
    resolver = TaskResolver(tasks, ttl_s=5.0, clock=clock)
    await resolver.resolve("pavement.distress.jpcp")
    tasks.unavailable = True
    clock.now += 10.0
    assert (await resolver.resolve("pavement.distress.jpcp")).model == "JPCP"
    reads = tasks.reads
    await resolver.resolve("pavement.distress.jpcp")
    assert tasks.reads == reads  # kept for another TTL, not read again on every call
    tasks.unavailable = False
    tasks.map("pavement.distress.jpcp", "AC", "Production")
    clock.now += 5.0
    assert (await resolver.resolve("pavement.distress.jpcp")).model == "AC"


async def test_before_any_read_succeeded_a_down_store_is_store_unavailable(tasks: InMemoryTaskMap) -> None:
    tasks.unavailable = True
    resolver = TaskResolver(tasks, ttl_s=5.0, clock=Clock())
    with pytest.raises(StoreUnavailable):
        await resolver.resolve("pavement.distress.jpcp")
    tasks.unavailable = False
    assert (await resolver.resolve("pavement.distress.jpcp")).model == "JPCP"


async def test_a_task_address_resolves_to_its_route_and_survives_a_remap(tasks: InMemoryTaskMap) -> None:
    clock = Clock()
    resolver = TaskResolver(tasks, ttl_s=1.0, clock=clock)
    address = tasks.rows["pavement.distress.jpcp"].address
    assert (await resolver.by_address(address)) == tasks.rows["pavement.distress.jpcp"]
    tasks.map("pavement.distress.jpcp", "CRCP", "Production")
    clock.now += 1.0
    route = await resolver.by_address(address)
    assert route is not None and route.model == "CRCP"
    assert [r.address for r in await resolver.routes()] == [address]


async def test_a_cancelled_caller_does_not_cancel_the_shared_read(tasks: InMemoryTaskMap) -> None:
    resolver = TaskResolver(tasks, ttl_s=30.0, clock=Clock())
    first = asyncio.create_task(resolver.resolve("pavement.distress.jpcp"))
    second = asyncio.create_task(resolver.resolve("pavement.distress.jpcp"))
    await asyncio.sleep(0)
    first.cancel()
    assert (await second).model == "JPCP"
