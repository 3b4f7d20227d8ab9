"""`exa audit verify` lists the aliases no alias event covers, instead of passing them in silence."""

from __future__ import annotations

from examlops.core.errors import RegistryUnavailable
from examlops.monitoring.audit.coverage import AliasCoverage, UncoveredAlias, uncovered_aliases
from examlops.promotion.service import move_audited
from examlops.promotion.trail import check_aliases
from tests.unit.promotion.fakes import InMemoryAliasRegistry, InMemoryMoveTrail


def test_an_alias_no_event_covers_is_listed_as_not_covered_and_an_audited_one_is_not() -> None:
    registry, trail = InMemoryAliasRegistry(), InMemoryMoveTrail()  # Production 1, Canary 2: set outside the trail
    move_audited(registry, "AC", "Staging", version="3", trail=trail)
    registry.aliases["Production"] = "2"  # moved outside examlops: the trail never named it, so nothing tells
    moves = list(trail.lasts.values())

    def aliases_of(model: str) -> dict[str, str]:
        registry.resolve(model, "Staging")  # ModelNotFound for a model the registry lacks
        return dict(registry.aliases)

    found = uncovered_aliases(moves, ["ac", "CRCP"], aliases_of)
    assert found == AliasCoverage((UncoveredAlias("ac", "Canary", "2"), UncoveredAlias("ac", "Production", "2")))
    assert found.notes == ("not covered by the trail: ac@Canary -> 2", "not covered by the trail: ac@Production -> 2")
    assert check_aliases(moves, lambda: registry).unaccounted == ()  # what the alias check alone says: all well

    move_audited(registry, "AC", "Production", version="1", trail=trail)
    covered = uncovered_aliases(trail.lasts.values(), ["AC"], aliases_of)
    assert covered.uncovered == (UncoveredAlias("AC", "Canary", "2"),) and covered.unchecked is None
    registry.aliases["Production"] = "3"  # now the alias check sees the outside move
    assert len(check_aliases(list(trail.lasts.values()), lambda: registry).unaccounted) == 1


def test_a_registry_that_cannot_be_read_stops_the_listing_at_once_and_says_why() -> None:
    asked: list[str] = []

    def unreachable(model: str) -> dict[str, str]:
        asked.append(model)
        raise RegistryUnavailable("MLflow at http://mlflow:5000 did not answer within 5 s")

    found = uncovered_aliases([], ["AC", "CRCP", "JPCP"], unreachable)
    assert asked == ["AC"] and found.uncovered == ()
    assert found.notes == (
        "aliases not covered by the trail not listed: MLflow at http://mlflow:5000 did not answer within 5 s",
    )
