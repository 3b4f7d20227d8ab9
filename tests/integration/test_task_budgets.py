"""Task default budgets in real SQL: migration 0005 on SQLite and Postgres, and `exa task map --budget-ms`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy
from alembic import command
from typer.testing import CliRunner

from examlops.bootstrap import upgrade_database
from examlops.bootstrap.identity import provision_admin
from examlops.cli.main import app as exa
from examlops.core.settings import Settings
from examlops.db import create_sql_engine, schema_diff, upgrade
from examlops.db.state import alembic_config

pytestmark = pytest.mark.integration

ROW = (
    "INSERT INTO taskmapping (task, model, alias, adapter, address, changed_at) "
    "VALUES ('t.kept', 'JPCP', 'Production', '', 'a6f0f7b8-8d3c-4a57-9a59-0f3c7e6f8e11', '2026-12-01 00:00:00+00')"
)


def columns(engine: sqlalchemy.Engine) -> set[str]:
    return {column["name"] for column in sqlalchemy.inspect(engine).get_columns("taskmapping")}


def migrate(engine: sqlalchemy.Engine, verb: str, revision: str) -> None:
    with engine.begin() as connection:
        getattr(command, verb)(alembic_config(connection), revision)


def test_migration_0005_adds_the_default_budget_keeping_every_task_and_goes_back_cleanly(database_url: str) -> None:
    from examlops.bootstrap import table_metadata

    engine = create_sql_engine(database_url)
    try:
        migrate(engine, "upgrade", "0004")
        with engine.begin() as connection:
            connection.exec_driver_sql(ROW)
        assert "budget_ms" not in columns(engine)
        migrate(engine, "upgrade", "0005")
        assert "budget_ms" in columns(engine)
        with engine.begin() as connection:
            assert connection.exec_driver_sql("SELECT task, budget_ms FROM taskmapping").all() == [("t.kept", None)]
            connection.exec_driver_sql("UPDATE taskmapping SET budget_ms = 250.0")
        migrate(engine, "downgrade", "0004")
        assert "budget_ms" not in columns(engine)
        with engine.begin() as connection:
            assert connection.exec_driver_sql("SELECT task FROM taskmapping").all() == [("t.kept",)]
        upgrade(database_url)  # to the newest revision: the models' schema
        with engine.connect() as connection:
            assert schema_diff(connection, table_metadata()) == []
    finally:
        engine.dispose()


@pytest.fixture
def cli_env(tmp_path: Path, redis_server: str, client: object, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A state folder with its schema upgraded and its admin, audit events to the session's (flushed) Redis."""
    monkeypatch.setenv("EXAMLOPS_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("EXAMLOPS_REDIS__URL", redis_server)
    upgrade_database(Settings())
    provision_admin(Settings())
    yield


def test_exa_task_map_sets_keeps_and_clears_a_tasks_default_budget_listed_and_audited(cli_env: None) -> None:
    runner = CliRunner()

    def run(*args: str) -> dict[str, object]:
        result = runner.invoke(exa, [*args, "--json"])
        assert result.exit_code == 0, result.output
        loaded: dict[str, object] = json.loads(result.stdout)
        return loaded

    assert run("task", "map", "t.budgeted", "JPCP", "--budget-ms", "250")["budget_ms"] == 250.0
    remapped = run("task", "map", "t.budgeted", "CRCP")  # no budget option: the budget stays
    assert (remapped["model"], remapped["budget_ms"]) == ("CRCP", 250.0)
    [listed] = json.loads(runner.invoke(exa, ["task", "list", "--json"]).stdout)
    assert (listed["task"], listed["budget_ms"]) == ("t.budgeted", 250.0)
    assert "250 ms" in runner.invoke(exa, ["task", "list"]).stdout
    assert run("task", "map", "t.budgeted", "CRCP", "--no-budget")["budget_ms"] is None
    both = runner.invoke(exa, ["task", "map", "t.budgeted", "CRCP", "--budget-ms", "5", "--no-budget"])
    assert both.exit_code == 2

    tail = runner.invoke(exa, ["audit", "tail", "-n", "50", "--json"])
    events = [e for e in json.loads(tail.stdout) if e["type"] == "task.mapped"]
    assert [e["data"]["budget_ms"] for e in events] == [250.0, 250.0, None]
    assert [e["data"]["previous"] and e["data"]["previous"]["budget_ms"] for e in events] == [None, 250.0, 250.0]
