"""The router: weighted splits on the default alias, pinning, case-insensitive names, the rules cache."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from examlops.core.errors import InvalidInput, StoreUnavailable
from examlops.serving.router import Router, validate_split
from tests.unit.serving.fakes import FakeClock, InMemoryTrafficRules, make_spec

ALL = {"Production", "Canary", "Staging"}
JPCP = make_spec("JPCP")


def router(rules: InMemoryTrafficRules, clock: FakeClock | None = None, ttl_s: float = 30.0) -> Router:
    return Router(rules, ttl_s, clock or FakeClock(), random.Random(7))


def test_split_is_drawn_within_binomial_bounds() -> None:
    rules = InMemoryTrafficRules()
    rules.set("JPCP", {"Production": 90, "Canary": 10})
    r = router(rules)
    draws = 5000
    counts = Counter(r.choose(JPCP, None, ALL) for _ in range(draws))
    assert set(counts) == {"Production", "Canary"}
    sigma = math.sqrt(draws * 0.1 * 0.9)
    assert abs(counts["Canary"] - draws * 0.1) < 4 * sigma


def test_the_split_applies_to_the_default_alias_in_any_spelling() -> None:
    rules = InMemoryTrafficRules()
    rules.set("jpcp", {"Canary": 100})
    r = router(rules)
    assert r.choose(JPCP, "production", ALL) == "Canary"
    assert r.choose(JPCP, "PRODUCTION", ALL) == "Canary"


def test_a_split_set_for_JPCP_applies_to_jpcp() -> None:
    rules = InMemoryTrafficRules()
    rules.set("JPCP", {"canary": 100})  # stored as given, matched case-insensitively
    assert router(rules).choose(make_spec("jpcp"), None, ALL) == "Canary"


def test_a_request_pinned_to_another_alias_gets_that_alias() -> None:
    rules = InMemoryTrafficRules()
    rules.set("JPCP", {"Production": 50, "Canary": 50})
    r = router(rules)
    assert {r.choose(JPCP, "staging", ALL) for _ in range(50)} == {"Staging"}
    assert {r.choose(JPCP, "canary", ALL) for _ in range(50)} == {"Canary"}


def test_no_split_sends_default_traffic_to_the_default_alias() -> None:
    assert router(InMemoryTrafficRules()).choose(JPCP, None, ALL) == "Production"


def test_a_disappeared_alias_gives_its_share_to_the_rest() -> None:
    rules = InMemoryTrafficRules()
    rules.set("JPCP", {"Production": 60, "Canary": 30, "Staging": 10})
    r = router(rules)
    assert {r.choose(JPCP, None, {"Production", "Staging"}) for _ in range(500)} == {"Production", "Staging"}
    assert {r.choose(JPCP, None, {"Production"}) for _ in range(100)} == {"Production"}


def test_when_no_alias_of_the_split_is_available_the_default_alias_answers() -> None:
    rules = InMemoryTrafficRules()
    rules.set("JPCP", {"Canary": 100})
    assert router(rules).choose(JPCP, None, {"Production"}) == "Production"


def test_a_changed_rule_is_seen_only_after_the_ttl() -> None:
    rules = InMemoryTrafficRules()
    clock = FakeClock()
    r = router(rules, clock, ttl_s=30)
    assert r.choose(JPCP, None, ALL) == "Production"
    rules.set("JPCP", {"Canary": 100})
    clock.advance(29)
    assert r.choose(JPCP, None, ALL) == "Production"
    clock.advance(2)
    assert r.choose(JPCP, None, ALL) == "Canary"
    assert rules.reads == 2


def test_set_rules_invalidates_this_process_cache_at_once() -> None:
    rules = InMemoryTrafficRules()
    r = router(rules)
    assert r.choose(JPCP, None, ALL) == "Production"
    r.set_rules("jpcp", {"Canary": 100})
    assert r.choose(JPCP, None, ALL) == "Canary"


def test_an_unreadable_store_keeps_the_last_split() -> None:
    rules = InMemoryTrafficRules()
    rules.set("JPCP", {"Canary": 100})
    clock = FakeClock()
    r = router(rules, clock)
    assert r.choose(JPCP, None, ALL) == "Canary"
    rules.unavailable = True
    clock.advance(31)
    assert r.choose(JPCP, None, ALL) == "Canary"


def test_validate_split_canonicalises_names() -> None:
    assert validate_split({"production": 90, "CANARY": 10}, ALL) == {"Production": 90, "Canary": 10}
    assert validate_split({}, ALL) == {}


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({"Production": 90, "Shadow": 10}, "does not exist"),
        ({"Production": 110, "Canary": -10}, "must not be negative"),
        ({"Production": 90, "Canary": 5}, "add up to 100, not 95"),
        ({"Production": 50, "production": 50}, "named twice"),
        ({"Production": 99.5, "Canary": 0.5}, "whole number"),
    ],
)
def test_validate_split_refuses_bad_splits(weights: dict[str, int], message: str) -> None:
    with pytest.raises(InvalidInput, match=message) as caught:
        validate_split(weights, {"Production", "Canary"})
    assert caught.value.field == "weights"


def test_read_reports_an_unreachable_store_while_routing_does_not() -> None:
    rules = InMemoryTrafficRules()
    rules.unavailable = True
    r = router(rules)
    with pytest.raises(StoreUnavailable):
        r.read("JPCP")
    assert r.choose(JPCP, None, ALL) == "Production"
