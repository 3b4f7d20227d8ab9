"""Seeding the task map from the catalog and remapping a task, each change audited, bad input changing nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from examlops.core.errors import InvalidInput, ModelNotFound, StoreUnavailable
from examlops.registry.catalog import Catalog, ModelSpec
from examlops.tasks.service import map_task, seed_tasks
from tests.unit.serving.fakes import make_spec
from tests.unit.tasks.fakes import InMemoryTaskMap


class Audit:
    def __init__(self, fail: bool = False) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []
        self.fail = fail

    def __call__(self, type: str, subject: str, data: Mapping[str, Any]) -> None:
        if self.fail:
            raise StoreUnavailable("redis is down")
        self.events.append((type, subject, dict(data)))


def spec(name: str, *tasks: str) -> ModelSpec:
    return make_spec(name).model_copy(update={"tasks": tasks})


@pytest.fixture
def catalog() -> Catalog:
    return Catalog((spec("JPCP", "pavement.distress.jpcp"), spec("CRCP", "pavement.distress.crcp"), spec("AC")))


def test_seeding_maps_every_catalog_task_to_its_model_default_alias_and_audits_it(catalog: Catalog) -> None:
    tasks, audit = InMemoryTaskMap(), Audit()
    created = seed_tasks(tasks, catalog, audit)
    assert [(r.task, r.model, r.alias) for r in created] == [
        ("pavement.distress.jpcp", "JPCP", "Production"),
        ("pavement.distress.crcp", "CRCP", "Production"),
    ]
    assert [(t, s, d["actor"]) for t, s, d in audit.events] == [
        ("task.mapped", "pavement.distress.jpcp", "system:catalog"),
        ("task.mapped", "pavement.distress.crcp", "system:catalog"),
    ]


def test_seeding_again_never_overwrites_an_operator_remap_nor_moves_an_address(catalog: Catalog) -> None:
    tasks, audit = InMemoryTaskMap(), Audit()
    seed_tasks(tasks, catalog, audit)
    address = tasks.rows["pavement.distress.jpcp"].address
    map_task(tasks, catalog, "pavement.distress.jpcp", "AC", "Canary", actor="operator", audit=audit)
    assert seed_tasks(tasks, catalog, audit) == []
    route = tasks.rows["pavement.distress.jpcp"]
    assert (route.model, route.alias, route.address) == ("AC", "Canary", address)


def test_a_remap_keeps_the_address_and_audits_who_did_it_and_what_it_was(catalog: Catalog) -> None:
    tasks, audit = InMemoryTaskMap(), Audit()
    seed_tasks(tasks, catalog)
    address = tasks.rows["pavement.distress.jpcp"].address
    done = map_task(tasks, catalog, "Pavement.Distress.JPCP", "crcp", "canary", actor="exa task map", audit=audit)
    assert done.audited
    assert (done.change.route.model, done.change.route.alias, done.change.route.address) == ("CRCP", "Canary", address)
    [(kind, subject, data)] = audit.events
    assert (kind, subject, data["actor"], data["model"], data["alias"]) == (
        "task.mapped",
        "pavement.distress.jpcp",
        "exa task map",
        "CRCP",
        "Canary",
    )
    assert data["address"] == str(address)
    assert (data["previous"]["model"], data["previous"]["alias"]) == ("JPCP", "Production")


def test_a_new_task_gets_the_model_default_alias_when_none_is_given(catalog: Catalog) -> None:
    tasks = InMemoryTaskMap()
    done = map_task(tasks, catalog, "pavement.new", "AC", None, actor="x", audit=Audit())
    assert (done.change.route.alias, done.change.previous) == ("Production", None)


def test_an_unknown_model_is_refused_and_changes_nothing(catalog: Catalog) -> None:
    tasks, audit = InMemoryTaskMap(), Audit()
    seed_tasks(tasks, catalog)
    before = dict(tasks.rows)
    with pytest.raises(ModelNotFound, match="NOPE"):
        map_task(tasks, catalog, "pavement.distress.jpcp", "NOPE", None, actor="x", audit=audit)
    assert tasks.rows == before
    assert audit.events == []


@pytest.mark.parametrize(("alias", "aliases"), [("bogus", ("Production", "Canary")), ("Staging", ("Production",))])
def test_an_alias_serving_does_not_load_is_refused_naming_those_it_does_and_changes_nothing(
    catalog: Catalog, alias: str, aliases: tuple[str, ...]
) -> None:
    tasks, audit = InMemoryTaskMap(), Audit()
    seed_tasks(tasks, catalog)
    before = dict(tasks.rows)
    with pytest.raises(InvalidInput) as caught:
        map_task(tasks, catalog, "pavement.distress.jpcp", "JPCP", alias, actor="x", audit=audit, aliases=aliases)
    assert caught.value.field == "alias"
    assert ", ".join(aliases) in caught.value.message and alias in caught.value.message
    assert tasks.rows == before and audit.events == []


def test_a_served_alias_is_taken_in_any_case_and_spelt_as_configured(catalog: Catalog) -> None:
    tasks = InMemoryTaskMap()
    done = map_task(tasks, catalog, "pavement.x", "JPCP", "shadow", actor="x", audit=Audit(), aliases=("Shadow",))
    assert done.change.route.alias == "Shadow"


@pytest.mark.parametrize("aliases", [("Canary",), ("production", "canary")])
def test_the_models_default_alias_is_served_whatever_the_hot_sets_list_says(
    catalog: Catalog, aliases: tuple[str, ...]
) -> None:
    tasks = InMemoryTaskMap()
    done = map_task(tasks, catalog, "pavement.y", "JPCP", None, actor="x", audit=Audit(), aliases=aliases)
    assert done.change.route.alias == catalog.get("JPCP").default_alias_canonical
    again = map_task(tasks, catalog, "pavement.y", "JPCP", "PRODUCTION", actor="x", audit=Audit(), aliases=aliases)
    assert again.change.route.alias.lower() == "production"


@pytest.mark.parametrize("name", ["", "a b", ".starts.with.dot", "x" * 129, "task/with/slash"])
def test_a_name_that_cannot_be_a_task_is_refused_and_changes_nothing(catalog: Catalog, name: str) -> None:
    tasks, audit = InMemoryTaskMap(), Audit()
    with pytest.raises(InvalidInput) as caught:
        map_task(tasks, catalog, name, "JPCP", None, actor="x", audit=audit)
    assert caught.value.field == "task"
    assert len(caught.value.message) < 200
    assert tasks.rows == {} and audit.events == []


def test_a_remap_whose_audit_cannot_be_written_stays_done_and_says_so(catalog: Catalog) -> None:
    tasks = InMemoryTaskMap()
    done = map_task(tasks, catalog, "pavement.distress.jpcp", "JPCP", None, actor="x", audit=Audit(fail=True))
    assert not done.audited and done.audit_error == "redis is down"
    assert tasks.rows["pavement.distress.jpcp"].model == "JPCP"


def test_a_catalog_budget_seeds_the_task_default_and_a_remap_keeps_or_changes_it_audited() -> None:
    jpcp = spec("JPCP", "pavement.distress.jpcp").model_copy(
        update={"task_budgets_ms": (("pavement.distress.jpcp", 80.0),)}
    )
    catalog, tasks, audit = Catalog((jpcp, spec("AC"))), InMemoryTaskMap(), Audit()
    (seeded,) = seed_tasks(tasks, catalog, audit)
    assert seeded.budget_ms == 80.0
    assert audit.events[-1][2]["budget_ms"] == 80.0
    kept = map_task(tasks, catalog, "pavement.distress.jpcp", "AC", None, actor="op", audit=audit)
    assert kept.change.route.budget_ms == 80.0
    changed = map_task(tasks, catalog, "pavement.distress.jpcp", "AC", None, actor="op", audit=audit, budget_ms=25.0)
    assert (changed.change.route.budget_ms, changed.change.previous and changed.change.previous.budget_ms) == (25, 80)
    assert audit.events[-1][2]["budget_ms"] == 25.0
    assert audit.events[-1][2]["previous"]["budget_ms"] == 80.0
    cleared = map_task(tasks, catalog, "pavement.distress.jpcp", "AC", None, actor="op", audit=audit, budget_ms=None)
    assert cleared.change.route.budget_ms is None


def test_a_budget_out_of_range_changes_nothing_and_audits_nothing(catalog: Catalog) -> None:
    tasks, audit = InMemoryTaskMap(), Audit()
    with pytest.raises(InvalidInput, match="budget"):
        map_task(tasks, catalog, "pavement.distress.jpcp", "JPCP", None, actor="op", audit=audit, budget_ms=0.0)
    assert tasks.rows == {} and audit.events == []


def test_a_catalog_budget_must_name_a_task_the_model_lists() -> None:
    data = spec("JPCP", "pavement.distress.jpcp").model_dump()
    with pytest.raises(ValueError, match="does not list"):
        ModelSpec.model_validate({**data, "task_budgets_ms": {"pavement.distress.crcp": 50}})
    read = ModelSpec.model_validate({**data, "task_budgets_ms": {"Pavement.Distress.JPCP": 50}})
    assert read.budget_of("pavement.distress.jpcp") == 50.0
