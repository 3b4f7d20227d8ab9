"""What a promotion or rollback refuses or skips before it writes anything: a model not in the catalog, an
alias serving does not load, a move to the version the alias already has."""

from __future__ import annotations

from pathlib import Path

import pytest

from examlops.core.errors import InvalidInput, ModelNotFound
from examlops.core.settings import Settings
from examlops.promotion.service import move_audited, promote, rollback
from tests.unit.promotion.fakes import FakeServing, InMemoryAliasRegistry, InMemoryMoveTrail, Network
from tests.unit.serving.fakes import make_catalog

A = "http://a:1"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path)


@pytest.mark.parametrize(
    ("alias", "from_alias", "field"),
    [("Bogus", "Canary", "alias"), ("Production", "Bogus", "from_alias"), ("bogus", None, "alias")],
)
def test_an_alias_serving_does_not_load_is_refused_before_the_registry_is_asked(
    settings: Settings, alias: str, from_alias: str | None, field: str
) -> None:
    registry, trail = InMemoryAliasRegistry(), InMemoryMoveTrail()
    serving = FakeServing(registry)
    net = Network({"a:1": serving})
    with pytest.raises(InvalidInput) as raised:
        promote(settings, registry, "AC", alias, version=None if from_alias else 2, from_alias=from_alias,
                catalog=make_catalog("AC"), instances=[A], trail=trail, transport=net)  # fmt: skip
    assert "serving loads the aliases Production, Canary, Staging of AC" in str(raised.value)
    assert raised.value.field == field
    assert registry.calls == [] and trail.events == [] and serving.reloads == []
    assert registry.aliases == {"Production": "1", "Canary": "2"} and registry.tags == {}


def test_a_rollback_of_an_alias_serving_does_not_load_is_refused_before_the_registry_is_asked(
    settings: Settings,
) -> None:
    registry, trail = InMemoryAliasRegistry(), InMemoryMoveTrail()
    with pytest.raises(InvalidInput, match="'Bogus' is none of them"):
        rollback(settings, registry, "AC", "Bogus", instances=[A], trail=trail, transport=Network({}))
    assert registry.calls == [] and trail.events == []


def test_the_aliases_allowed_are_those_the_settings_load_and_the_model_default_alias(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, hotset={"aliases": ("Canary", "Shadow")})
    registry = InMemoryAliasRegistry()
    registry.aliases["Shadow"] = "3"
    net = Network({"a:1": FakeServing(registry)})
    moved = promote(settings, registry, "ac", "shadow", version=2, catalog=make_catalog("AC"), instances=[A],
                    transport=net)  # fmt: skip
    assert (moved.alias, moved.old_version, moved.new_version) == ("Shadow", "3", "2")
    back = promote(settings, registry, "AC", "production", from_alias="canary", catalog=make_catalog("AC"),
                   instances=[A], transport=net)  # fmt: skip
    assert (back.alias, back.new_version) == ("Production", "2")  # the catalog's default alias is loaded too
    with pytest.raises(InvalidInput, match="serving loads the aliases Canary, Shadow, Production of AC"):
        promote(settings, registry, "AC", "Staging", version=1, catalog=make_catalog("AC"))


def test_a_model_not_in_the_catalog_gets_the_catalog_message_and_the_registry_is_not_asked(settings: Settings) -> None:
    registry, trail = InMemoryAliasRegistry(), InMemoryMoveTrail()
    catalog = make_catalog("AC", "JPCP")
    with pytest.raises(ModelNotFound, match=r"model 'NOPE' is not in the catalog \(known: AC, JPCP\)"):
        promote(settings, registry, "NOPE", "Production", version=2, catalog=catalog, trail=trail)
    with pytest.raises(ModelNotFound, match="is not in the catalog"):
        rollback(settings, registry, "NOPE", catalog=catalog, trail=trail)
    assert registry.calls == [] and trail.events == []


def test_a_rollback_to_the_version_the_alias_has_moves_nothing(settings: Settings) -> None:
    """The previous tag names the version the alias is at (moved back by hand in the MLflow UI): nothing moves in
    the registry; the instances are asked, and the trail, which never recorded the alias, records it as it is."""
    registry, trail = InMemoryAliasRegistry(), InMemoryMoveTrail()
    registry.tags["examlops.previous.Production"] = "1"
    serving = FakeServing(registry)
    result = rollback(settings, registry, "AC", catalog=make_catalog("AC"), instances=[A], trail=trail,
                      transport=Network({"a:1": serving}))  # fmt: skip
    assert (result.old_version, result.new_version, result.instances, result.nothing_to_do) == ("1", "1", (A,), True)
    assert registry.writes == [] and registry.tags["examlops.previous.Production"] == "1"
    last = trail.last("AC", "Production")
    assert last is not None and (last.state, last.new_version) == ("moved", "1")


def test_an_audited_move_to_the_version_the_alias_has_writes_nothing() -> None:
    registry, trail = InMemoryAliasRegistry(), InMemoryMoveTrail()
    move = move_audited(registry, "AC", "Canary", version="2", trail=trail)
    assert (move.old_version, move.new_version) == ("2", "2")
    assert registry.writes == [] and trail.events == []
