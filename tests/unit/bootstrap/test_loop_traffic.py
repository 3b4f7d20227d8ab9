"""The closed loop sets a split as serving does: its ``traffic.changed`` event first; no event, no change."""

from __future__ import annotations

import pytest

from examlops.bootstrap.loop import _Traffic
from examlops.core.errors import StoreUnavailable
from tests.unit.serving.fakes import InMemoryControlTrail, InMemoryTrafficRules

SPLIT = {"Production": 90, "Canary": 10}


def test_the_loop_changes_no_split_whose_event_cannot_be_written() -> None:
    rules, trail = InMemoryTrafficRules(), InMemoryControlTrail()
    traffic = _Traffic(rules, trail, settle_s=31.0, actor="system:loop")  # type: ignore[arg-type]  # a fake store
    traffic.set("JPCP", SPLIT)
    assert trail.events == [("traffic.changed", "JPCP", {"weights": SPLIT, "actor": "system:loop"})]
    trail.down = True
    with pytest.raises(StoreUnavailable, match="JPCP: the traffic split was not changed"):
        traffic.set("JPCP", {})
    assert traffic.get("JPCP") == SPLIT
