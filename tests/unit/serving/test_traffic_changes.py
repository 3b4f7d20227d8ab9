"""A traffic change and its audit event: the event first, and no event, no change (the rule promotions follow)."""

from __future__ import annotations

import asyncio

import pytest

from examlops.core.errors import InvalidInput, StoreUnavailable
from tests.unit.serving.fakes import InMemoryControlTrail
from tests.unit.serving.test_pipeline import World, world

__all__ = ["world"]  # the fixture, imported for pytest

SPLIT = {"Production": 90, "Canary": 10}


async def test_a_split_whose_event_cannot_be_written_is_not_changed_and_the_error_says_so(world: World) -> None:
    trail = InMemoryControlTrail()
    pipeline = world.pipeline(on_event=trail)
    await pipeline.start()
    await asyncio.to_thread(pipeline.set_traffic, "JPCP", {"Production": 100}, "ops")
    trail.down = True
    for asked in (SPLIT, {}):  # clearing the split is a change too
        with pytest.raises(StoreUnavailable, match=r"JPCP: the traffic split was not changed: its traffic\.changed"):
            await asyncio.to_thread(pipeline.set_traffic, "jpcp", asked, "ops")
    assert world.rules.splits == {"jpcp": {"Production": 100}}
    assert pipeline.traffic("JPCP") == {"Production": 100}
    assert {await pipeline.route("JPCP") for _ in range(20)} == {"Production"}
    assert trail.events == [("traffic.changed", "JPCP", {"weights": {"Production": 100}, "actor": "ops"})]


async def test_the_event_is_written_before_the_split_is_stored(world: World) -> None:
    seen: list[dict[str, int]] = []
    pipeline = world.pipeline(on_event=lambda type, subject, data: seen.append(world.rules.get(subject)))
    await pipeline.start()
    await asyncio.to_thread(pipeline.set_traffic, "JPCP", SPLIT, "ops")
    assert seen == [{}]  # the split was not stored yet when the event went out
    assert world.rules.splits == {"jpcp": SPLIT}


async def test_a_split_the_store_refuses_is_followed_by_a_change_failed_event(world: World) -> None:
    trail = InMemoryControlTrail()
    pipeline = world.pipeline(on_event=trail)
    await pipeline.start()
    world.rules.unavailable = True
    with pytest.raises(StoreUnavailable, match="SQL is down") as raised:
        await asyncio.to_thread(pipeline.set_traffic, "JPCP", SPLIT, "ops")
    assert not getattr(raised.value, "__notes__", None)
    assert world.rules.splits == {}
    assert trail.events == [
        ("traffic.changed", "JPCP", {"weights": SPLIT, "actor": "ops"}),
        ("traffic.change_failed", "JPCP", {"weights": SPLIT, "actor": "ops", "error": "StoreUnavailable: SQL is down"}),
    ]


async def test_a_refused_split_whose_failed_event_is_lost_too_says_the_trail_is_wrong(world: World) -> None:
    trail = InMemoryControlTrail(down_after=1)
    pipeline = world.pipeline(on_event=trail)
    await pipeline.start()
    world.rules.unavailable = True
    with pytest.raises(StoreUnavailable, match="SQL is down") as raised:
        await asyncio.to_thread(pipeline.set_traffic, "JPCP", SPLIT, "ops")
    assert raised.value.__notes__ == [
        "its traffic.change_failed audit event was not written either: cannot append to the audit trail: "
        "Timeout reading from 127.0.0.1:18004"
    ]
    assert [event[0] for event in trail.events] == ["traffic.changed"]


async def test_check_traffic_refuses_what_set_traffic_would_and_changes_nothing(world: World) -> None:
    trail = InMemoryControlTrail()
    pipeline = world.pipeline(on_event=trail)
    await pipeline.start()
    assert pipeline.check_traffic("jpcp", {"production": 90, "CANARY": 10}) == SPLIT
    with pytest.raises(InvalidInput, match="the weight of Canary must not be negative"):
        pipeline.check_traffic("JPCP", {"Production": 150, "Canary": -50})
    with pytest.raises(InvalidInput, match="Staging"):
        pipeline.check_traffic("JPCP", {"Production": 90, "Staging": 10})
    assert world.rules.splits == {} and trail.events == []
