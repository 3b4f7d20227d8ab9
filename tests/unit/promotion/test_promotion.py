"""Promotion against an in-memory registry and a faked network (httpx's transport seam)."""

from __future__ import annotations

from pathlib import Path

import pytest

from examlops.core.errors import (
    InvalidInput,
    PromotionIncomplete,
    RegistryUnavailable,
    StoreUnavailable,
    VersionNotFound,
)
from examlops.core.settings import Settings
from examlops.promotion import instances
from examlops.promotion.aliases import AliasMove, plan_rollback, previous_tag
from examlops.promotion.service import promote, rollback
from examlops.promotion.trail import check_aliases, unaccounted, unaccounted_moves
from tests.unit.promotion.fakes import (
    FakeServing,
    InMemoryAliasRegistry,
    InMemoryMoveTrail,
    Network,
    TagWriteFails,
    UnreachableRegistry,
)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path)


A, B, DEAD = "http://a:1", "http://b:2", "http://dead:3"


def test_promote_moves_the_alias_records_the_old_version_and_waits_for_every_instance(settings: Settings) -> None:
    registry = InMemoryAliasRegistry()
    a, b = FakeServing(registry), FakeServing(registry)
    trail = InMemoryMoveTrail()
    result = promote(
        settings,
        registry,
        "ac",
        "production",
        version=3,
        instances=[A, B],
        trail=trail,
        transport=Network({"a:1": a, "b:2": b}),
    )
    assert (result.model, result.alias, result.old_version, result.new_version) == ("AC", "Production", "1", "3")
    assert result.instances == (A, B)
    assert registry.aliases["Production"] == "3" and registry.tags[previous_tag("Production")] == "1"
    assert a.serving["Production"] == b.serving["Production"] == "3"
    assert a.reloads == [{"model": "AC"}]
    move = AliasMove("AC", "Production", "1", "3")
    assert trail.events == [("intended", move), ("moved", move)]


def test_promote_from_an_alias_and_rollback_twice_goes_back_and_forth(settings: Settings) -> None:
    registry = InMemoryAliasRegistry()
    net = Network({"a:1": FakeServing(registry)})
    promote(settings, registry, "AC", "Production", from_alias="canary", instances=[A], transport=net)
    assert registry.aliases["Production"] == "2"
    back = rollback(settings, registry, "AC", instances=[A], transport=net)
    assert (back.old_version, back.new_version) == ("2", "1")
    again = rollback(settings, registry, "AC", instances=[A], transport=net)
    assert (again.old_version, again.new_version) == ("1", "2")


def test_promoting_to_the_version_it_has_moves_nothing_keeps_the_previous_version_and_asks_the_instances(
    settings: Settings,
) -> None:
    registry, trail = InMemoryAliasRegistry(), InMemoryMoveTrail()
    serving = FakeServing(registry)
    net = Network({"a:1": serving})
    promote(settings, registry, "AC", "Production", version=2, instances=[A], trail=trail, transport=net)
    events, writes = list(trail.events), list(registry.writes)
    same = promote(settings, registry, "AC", "Production", version=2, instances=[A], trail=trail, transport=net)
    assert (same.old_version, same.new_version, same.instances, same.nothing_to_do) == ("2", "2", (A,), True)
    assert trail.events == events and registry.writes == writes  # the trail accounts for it: nothing recorded
    assert registry.tags[previous_tag("Production")] == "1"


def test_promoting_in_place_reports_an_instance_that_does_not_serve_it(settings: Settings) -> None:
    registry = InMemoryAliasRegistry()  # AC: Production 1
    net = Network({"a:1": FakeServing(registry)})  # dead:9 answers nothing
    with pytest.raises(PromotionIncomplete) as raised:
        promote(settings, registry, "AC", "Production", version=1, instances=[A, "http://dead:9"], transport=net)
    assert list(raised.value.lagging) == ["http://dead:9"] and raised.value.confirmed == (A,)
    assert registry.writes == []


def test_promoting_in_place_an_alias_the_trail_never_recorded_records_it_where_it_stands(
    settings: Settings,
) -> None:
    registry, trail = InMemoryAliasRegistry(), InMemoryMoveTrail()  # AC: Production 1, never on the trail
    net = Network({"a:1": FakeServing(registry)})
    same = promote(settings, registry, "AC", "Production", version=1, instances=[A], trail=trail, transport=net)
    assert same.nothing_to_do and registry.writes == []
    last = trail.last("AC", "Production")
    assert last is not None and (last.state, last.old_version, last.new_version) == ("moved", "1", "1")


def test_a_dead_a_refusing_and_a_lagging_instance_are_each_named_and_the_move_stays(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(instances, "POLL_S", 0.01)
    registry = InMemoryAliasRegistry()
    hosts = {
        "a:1": FakeServing(registry),
        "b:2": FakeServing(registry, refuse={"3"}),
        "lag:4": FakeServing(registry, lag=True),
    }
    with pytest.raises(PromotionIncomplete) as raised:
        promote(
            settings,
            registry,
            "AC",
            "Production",
            version=3,
            instances=[A, B, DEAD, "http://lag:4"],
            timeout_s=0.3,
            transport=Network(hosts),
        )
    error = raised.value
    assert error.confirmed == (A,)
    assert set(error.lagging) == {B, DEAD, "http://lag:4"}
    assert "refused version 3: version 3 refused: bad" in error.lagging[B]
    assert "cannot be reached" in error.lagging[DEAD]
    assert "still reports version 1" in error.lagging["http://lag:4"]
    assert "that move stays done" in str(error) and DEAD in str(error)
    assert registry.aliases["Production"] == "3"


def test_promotion_instances_default_to_the_settings(settings: Settings) -> None:
    registry = InMemoryAliasRegistry()
    local = settings.serving.local_url.removeprefix("http://")
    result = promote(
        settings, registry, "AC", "Production", version=2, transport=Network({local: FakeServing(registry)})
    )
    assert result.instances == (settings.serving.local_url,)


@pytest.mark.parametrize(("version", "from_alias"), [(None, None), (2, "Canary")])
def test_promote_needs_exactly_one_target(settings: Settings, version: int | None, from_alias: str | None) -> None:
    with pytest.raises(InvalidInput):
        promote(settings, InMemoryAliasRegistry(), "AC", "Production", version=version, from_alias=from_alias)


def test_nothing_recorded_means_nothing_to_roll_back_to(settings: Settings) -> None:
    registry = InMemoryAliasRegistry()
    with pytest.raises(VersionNotFound, match="no recorded previous version"):
        rollback(settings, registry, "AC", instances=[A], transport=Network({}))
    assert registry.aliases["Production"] == "1"


def test_an_intent_that_cannot_be_written_moves_nothing(settings: Settings) -> None:
    registry = InMemoryAliasRegistry()
    with pytest.raises(StoreUnavailable):
        promote(settings, registry, "AC", "Production", version=3, instances=[A], trail=InMemoryMoveTrail(
            frozenset({"intended"})), transport=Network({}))  # fmt: skip
    assert registry.aliases["Production"] == "1" and previous_tag("Production") not in registry.tags


def test_a_registry_that_fails_the_move_gets_a_failed_event_and_the_alias_stays(settings: Settings) -> None:
    registry, trail = UnreachableRegistry(), InMemoryMoveTrail()
    with pytest.raises(RegistryUnavailable):
        promote(settings, registry, "AC", "Production", version=3, instances=[A], trail=trail, transport=Network({}))
    move = AliasMove("AC", "Production", "1", "3")
    assert trail.events == [("intended", move), ("failed", move)]
    assert "cannot be reached" in trail.errors[0]
    assert registry.aliases["Production"] == "1"
    assert unaccounted(trail.last("AC", "Production"), registry.aliases["Production"]) is None


def test_a_failed_move_that_did_happen_is_reported_by_the_next_promotion(settings: Settings) -> None:
    registry, trail = UnreachableRegistry(applied=True), InMemoryMoveTrail()
    with pytest.raises(RegistryUnavailable):
        promote(settings, registry, "AC", "Production", version=3, instances=[A], trail=trail, transport=Network({}))
    assert registry.aliases["Production"] == "3"
    again = InMemoryAliasRegistry()
    again.aliases = registry.aliases
    result = promote(settings, again, "AC", "Production", version=2, instances=[A], trail=trail,
                     transport=Network({"a:1": FakeServing(again)}))  # fmt: skip
    assert result.unaccounted is not None and "recorded as failed" in result.unaccounted
    assert trail.unaccounted[-1] == result.unaccounted  # the new intent carries it onto the trail


def test_an_outcome_that_cannot_be_written_is_a_warning_and_leaves_an_intent_to_report(settings: Settings) -> None:
    registry, trail = InMemoryAliasRegistry(), InMemoryMoveTrail(frozenset({"moved"}))
    net = Network({"a:1": FakeServing(registry)})
    result = promote(settings, registry, "AC", "Production", version=3, instances=[A], trail=trail, transport=net)
    assert result.new_version == "3" and result.warnings and "outcome was not written" in result.warnings[0]
    line = unaccounted(trail.last("AC", "Production"), registry.aliases["Production"])
    assert line is not None and "has no recorded outcome" in line


def test_a_move_made_outside_the_trail_is_unaccounted_and_a_clean_one_is_not(settings: Settings) -> None:
    registry, trail = InMemoryAliasRegistry(), InMemoryMoveTrail()
    net = Network({"a:1": FakeServing(registry)})
    promote(settings, registry, "AC", "Production", version=3, instances=[A], trail=trail, transport=net)
    assert unaccounted_moves(trail.lasts.values(), registry) == []
    registry.aliases["Production"] = "2"  # someone used the MLflow UI
    (line,) = unaccounted_moves(trail.lasts.values(), registry)
    assert "last audited move put it at 3" in line and "registry has 2" in line


def test_the_stored_alias_check_finds_a_move_and_notes_an_unreachable_registry(settings: Settings) -> None:
    registry, trail = InMemoryAliasRegistry(), InMemoryMoveTrail()
    net = Network({"a:1": FakeServing(registry)})
    promote(settings, registry, "AC", "Production", version=3, instances=[A], trail=trail, transport=net)
    moves = list(trail.lasts.values())
    assert check_aliases(moves, lambda: registry).unaccounted == () and check_aliases([], lambda: registry).notes == ()
    registry.aliases["Production"] = "2"
    found = check_aliases(moves, lambda: registry)
    assert len(found.unaccounted) == 1 and found.unchecked is None and found.notes == ()

    def unreachable() -> InMemoryAliasRegistry:
        raise RegistryUnavailable("MLflow at http://mlflow:5000 did not answer within 5 s")

    down = check_aliases(moves, unreachable)
    assert down.unaccounted == () and down.notes == (
        "aliases not checked: MLflow at http://mlflow:5000 did not answer within 5 s",
    )


def test_a_rollback_is_audited_as_intent_and_outcome(settings: Settings) -> None:
    registry, trail = InMemoryAliasRegistry(), InMemoryMoveTrail()
    net = Network({"a:1": FakeServing(registry)})
    promote(settings, registry, "AC", "Production", version=3, instances=[A], trail=trail, transport=net)
    rollback(settings, registry, "AC", instances=[A], trail=trail, transport=net)
    back = AliasMove("AC", "Production", "3", "1")
    assert trail.events[-2:] == [("intended", back), ("moved", back)]


@pytest.mark.parametrize("failure", ["alias write refused", "alias write applied, reply lost"])
def test_a_promotion_that_fails_at_the_alias_write_leaves_a_rollback_going_where_it_should(
    settings: Settings, failure: str
) -> None:
    """Production went 2 -> 1 before (previous tag 2); a promotion to 3 then fails at its alias write: the
    error says the alias may have moved. A rollback goes to 2 while the alias is still at 1, and to 1 once the
    alias is at 3."""
    registry = UnreachableRegistry(applied=failure == "alias write applied, reply lost")
    registry.tags[previous_tag("Production")] = "2"
    trail = InMemoryMoveTrail()
    with pytest.raises(RegistryUnavailable) as raised:
        promote(settings, registry, "AC", "Production", version=3, instances=[A], trail=trail, transport=Network({}))
    assert raised.value.__notes__ == ["the alias may have moved; `exa audit verify` tells"]
    move = AliasMove("AC", "Production", "1", "3")
    assert trail.events == [("intended", move), ("failed", move)]
    back = plan_rollback(registry, "AC", "Production")
    if failure == "alias write refused":
        assert registry.aliases["Production"] == "1" and (back.old_version, back.new_version) == ("1", "2")
        assert unaccounted(trail.last("AC", "Production"), "1") is None
    else:
        assert registry.aliases["Production"] == "3" and (back.old_version, back.new_version) == ("3", "1")
        assert unaccounted(trail.last("AC", "Production"), "3") is not None  # the trail says failed; it moved


def test_a_previous_tag_not_written_after_the_alias_moved_is_a_move_with_a_warning(settings: Settings) -> None:
    """Production went 2 -> 1 before (previous tag 2); a promotion to 3 moves the alias, then the previous tag's
    write fails: the move is audited as done, every instance follows, a warning says so, and a rollback goes to
    1 (the moving tag)."""
    registry, trail = TagWriteFails(previous_tag("Production")), InMemoryMoveTrail()
    registry.tags[previous_tag("Production")] = "2"
    net = Network({"a:1": FakeServing(registry)})
    result = promote(settings, registry, "AC", "Production", version=3, instances=[A], trail=trail, transport=net)
    move = AliasMove("AC", "Production", "1", "3")
    assert trail.events == [("intended", move), ("moved", move)]
    assert result.instances == (A,) and (result.old_version, result.new_version) == ("1", "3")
    (warning,) = result.warnings
    assert "moved but the version it replaced was not recorded" in warning and "goes back to 1" in warning
    back = plan_rollback(registry, "AC", "Production")
    assert (back.old_version, back.new_version) == ("3", "1")
    assert unaccounted(trail.last("AC", "Production"), "3") is None


@pytest.mark.parametrize("down", ["intended", "moved"])
def test_promoting_in_place_with_the_trail_down_is_a_warning_and_still_asks_the_instances(
    settings: Settings, down: str
) -> None:
    registry, trail = InMemoryAliasRegistry(), InMemoryMoveTrail(fail_on=frozenset({down}))  # AC: Production 1
    net = Network({"a:1": FakeServing(registry)})
    same = promote(settings, registry, "AC", "Production", version=1, instances=[A], trail=trail, transport=net)
    assert same.nothing_to_do and same.instances == (A,) and registry.writes == []
    assert len(same.warnings) == 1 and "could not record where it is" in same.warnings[0]
