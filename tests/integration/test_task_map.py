"""The task map in real SQL (SQLite and Postgres), and `exa task map`/`list` with their audit events in real Redis."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from examlops.bootstrap import sql_engine, upgrade_database
from examlops.bootstrap.identity import provision_admin
from examlops.cli.main import app as exa
from examlops.core.errors import StoreUnavailable
from examlops.core.settings import Settings
from examlops.tasks.sql import SqlTaskMap

pytestmark = pytest.mark.integration


@pytest.fixture
def engine(database_url: str, tmp_path: Path) -> Iterator[Engine]:
    settings = Settings(home=tmp_path, database_url=database_url)
    upgrade_database(settings)
    engine = sql_engine(settings)
    yield engine
    engine.dispose()


@pytest.fixture
def tasks(engine: Engine) -> SqlTaskMap:
    return SqlTaskMap(engine)


def test_a_remap_changes_model_and_alias_and_keeps_the_address(tasks: SqlTaskMap) -> None:
    first = tasks.map("pavement.distress.jpcp", "JPCP", "Production")
    assert first.previous is None
    again = tasks.map("pavement.distress.jpcp", "CRCP", "Canary")
    assert again.previous == first.route
    assert (again.route.model, again.route.alias, again.route.address) == ("CRCP", "Canary", first.route.address)
    assert tasks.get("Pavement.Distress.JPCP") == again.route
    assert tasks.by_address(first.route.address) == again.route
    assert tasks.by_address(uuid.uuid4()) is None
    assert again.route.changed_at is not None and again.route.changed_at.tzinfo is not None


def test_every_task_has_its_own_address_and_the_list_is_sorted(tasks: SqlTaskMap) -> None:
    for name in ("b.task", "a.task", "c.task"):
        tasks.map(name, "JPCP", "Production")
    routes = tasks.routes()
    assert [r.task for r in routes] == ["a.task", "b.task", "c.task"]
    assert len({r.address for r in routes}) == 3


def test_adding_missing_tasks_never_touches_a_mapped_one(tasks: SqlTaskMap) -> None:
    remapped = tasks.map("pavement.distress.jpcp", "AC", "Canary").route
    created = tasks.add_missing(
        [("pavement.distress.jpcp", "JPCP", "Production"), ("pavement.new", "CRCP", "Production")]
    )
    assert [r.task for r in created] == ["pavement.new"]
    assert tasks.get("pavement.distress.jpcp") == remapped


def test_processes_seeding_at_once_create_each_task_once(tasks: SqlTaskMap) -> None:
    wanted = [(f"t.{n}", "JPCP", "Production") for n in range(20)]
    created: list[int] = []
    errors: list[BaseException] = []

    def seed() -> None:
        try:
            created.append(len(tasks.add_missing(wanted)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=seed) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sum(created) == 20
    assert len(tasks.routes()) == 20


def test_an_unreachable_database_is_store_unavailable(tmp_path: Path) -> None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'missing' / 'x.db'}")
    with pytest.raises(StoreUnavailable, match="task map"):
        SqlTaskMap(engine).routes()
    engine.dispose()


@pytest.fixture
def cli_env(tmp_path: Path, redis_server: str, client: object, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A state folder with its schema upgraded, audit events to the session's (flushed) Redis."""
    env = {"EXAMLOPS_HOME": str(tmp_path / "state"), "EXAMLOPS_REDIS__URL": redis_server}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    upgrade_database(Settings())
    provision_admin(Settings())  # as `exa up` does: the commands act as `admin`, with its token
    return env


def audit_events(runner: CliRunner) -> list[dict[str, object]]:
    tail = runner.invoke(exa, ["audit", "tail", "-n", "50", "--json"])
    assert tail.exit_code == 0, tail.output
    events: list[dict[str, object]] = json.loads(tail.stdout)
    return events


def test_exa_task_map_and_list_change_and_show_the_map_and_audit_who_did_it(cli_env: dict[str, str]) -> None:
    runner = CliRunner()
    mapped = runner.invoke(exa, ["task", "map", "pavement.distress.jpcp", "jpcp", "--json"])
    assert mapped.exit_code == 0, mapped.output
    first = json.loads(mapped.stdout)
    assert (first["task"], first["model"], first["alias"], first["previous"]) == (
        "pavement.distress.jpcp",
        "JPCP",
        "Production",
        None,
    )
    remapped = runner.invoke(exa, ["task", "map", "pavement.distress.jpcp", "CRCP", "--alias", "canary", "--json"])
    assert remapped.exit_code == 0, remapped.output
    second = json.loads(remapped.stdout)
    assert (second["model"], second["alias"], second["address"]) == ("CRCP", "Canary", first["address"])
    assert second["previous"]["model"] == "JPCP"

    listed = runner.invoke(exa, ["task", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    [row] = json.loads(listed.stdout)
    assert (row["task"], row["model"], row["alias"], row["address"]) == (
        "pavement.distress.jpcp",
        "CRCP",
        "Canary",
        first["address"],
    )
    table = runner.invoke(exa, ["task", "list"])
    assert table.exit_code == 0 and "CRCP" in table.stdout and "Canary" in table.stdout

    events = [e for e in audit_events(runner) if e["type"] == "task.mapped"]
    assert [(e["subject"], e["data"]["model"], e["data"]["actor"]) for e in events] == [  # type: ignore[index]
        ("pavement.distress.jpcp", "JPCP", "admin"),
        ("pavement.distress.jpcp", "CRCP", "admin"),
    ]
    verify = runner.invoke(exa, ["audit", "verify", "--json"])
    assert verify.exit_code == 0 and json.loads(verify.stdout)["ok"] is True


def test_exa_task_map_refuses_an_unknown_model_or_a_bad_name_and_changes_nothing(cli_env: dict[str, str]) -> None:
    runner = CliRunner()
    assert runner.invoke(exa, ["task", "map", "pavement.distress.jpcp", "JPCP"]).exit_code == 0
    before = runner.invoke(exa, ["task", "list", "--json"]).stdout

    unknown = runner.invoke(exa, ["task", "map", "pavement.distress.jpcp", "NOPE"])
    assert unknown.exit_code == 4
    assert "NOPE" in unknown.output and "JPCP" in unknown.output
    bad = runner.invoke(exa, ["task", "map", "a task with spaces", "JPCP"])
    assert bad.exit_code == 2

    assert runner.invoke(exa, ["task", "list", "--json"]).stdout == before
    assert len([e for e in audit_events(runner) if e["type"] == "task.mapped"]) == 1


def test_seeding_from_the_shipped_catalog_maps_its_tasks_once_and_keeps_a_remap(
    engine: Engine, tasks: SqlTaskMap
) -> None:
    from examlops.bootstrap.tasks import seed_task_map
    from examlops.registry.catalog import load_catalog

    catalog = load_catalog(Settings().catalog_path)
    created = seed_task_map(engine, catalog)
    assert sorted((r.task, r.model, r.alias) for r in created) == [
        ("pavement.distress.ac", "AC", "Production"),
        ("pavement.distress.crcp", "CRCP", "Production"),
        ("pavement.distress.jpcp", "JPCP", "Production"),
    ]
    remapped = tasks.map("pavement.distress.jpcp", "CRCP", "Canary").route
    assert seed_task_map(engine, catalog) == []
    assert tasks.get("pavement.distress.jpcp") == remapped
