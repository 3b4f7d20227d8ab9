"""The closed loop's split with its audit trail down: Canary gets no more traffic without its ``traffic.changed``
event, and traffic taken from Canary (a rejection, a split put back) is taken at once, the lost event raised."""

from __future__ import annotations

import pytest

from examlops.bootstrap.loop import _Traffic
from examlops.core.errors import StoreUnavailable
from tests.unit.serving.fakes import InMemoryControlTrail, InMemoryTrafficRules

SPLIT = {"Production": 90, "Canary": 10}


def test_canary_gets_no_more_traffic_without_its_event() -> None:
    rules, trail = InMemoryTrafficRules(), InMemoryControlTrail()
    traffic = _Traffic(rules, trail, settle_s=31.0, actor="system:loop")  # type: ignore[arg-type]  # a fake store
    traffic.set("JPCP", SPLIT)
    assert trail.events == [("traffic.changed", "JPCP", {"weights": SPLIT, "actor": "system:loop"})]
    trail.down = True
    with pytest.raises(StoreUnavailable, match="JPCP: the traffic split was not changed"):
        traffic.set("JPCP", {"Production": 50, "Canary": 50})
    assert traffic.get("JPCP") == SPLIT


@pytest.mark.parametrize("back", [{}, {"Production": 100}], ids=["no-split", "canary-at-0"])
def test_traffic_taken_from_canary_is_taken_while_the_trail_is_down(back: dict[str, int]) -> None:
    rules, trail = InMemoryTrafficRules(), InMemoryControlTrail()
    traffic = _Traffic(rules, trail, settle_s=31.0, actor="system:loop")  # type: ignore[arg-type]  # a fake store
    traffic.set("JPCP", SPLIT)
    trail.down = True
    with pytest.raises(StoreUnavailable):
        traffic.set("JPCP", back)
    assert traffic.get("JPCP") == back
