"""The SQL schema is made by migrations: the same as the models, once, on SQLite and on Postgres."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy
from sqlmodel import Session, select
from typer.testing import CliRunner

from examlops.bootstrap import sql_engine, table_metadata, upgrade_database
from examlops.core.errors import SchemaNotCurrent, StoreUnavailable
from examlops.core.settings import Settings
from examlops.db import create_sql_engine, head_revision, schema_diff, upgrade
from examlops.db.state import FIRST_TABLES
from examlops.serving.traffic_store import TrafficRule

pytestmark = pytest.mark.integration


def diff(url: str) -> list[object]:
    engine = create_sql_engine(url)
    try:
        with engine.connect() as connection:
            return schema_diff(connection, table_metadata())
    finally:
        engine.dispose()


def tables(url: str) -> set[str]:
    engine = create_sql_engine(url)
    try:
        return set(sqlalchemy.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_the_migrated_schema_is_the_models_schema_and_a_second_upgrade_changes_nothing(database_url: str) -> None:
    first = upgrade(database_url)
    assert (first.before.status, first.after.status, first.after.revision) == ("empty", "current", head_revision())
    assert diff(database_url) == []
    again = upgrade(database_url)
    assert (again.before.status, again.after.revision) == ("current", head_revision())


def test_a_database_made_by_create_all_before_migrations_is_adopted_with_its_rows(database_url: str) -> None:
    engine = create_sql_engine(database_url)
    metadata = table_metadata()  # what every process did before migrations, with the tables of that time
    metadata.create_all(engine, tables=[metadata.tables[name] for name in sorted(FIRST_TABLES)])
    with Session(engine) as session:
        session.add(TrafficRule(model="JPCP", alias="Canary", weight=10))
        session.commit()
    done = upgrade(database_url)
    assert done.adopted
    assert (done.before.status, done.after.revision) == ("unversioned", head_revision())
    with Session(engine) as session:
        assert [(r.model, r.alias, r.weight) for r in session.exec(select(TrafficRule))] == [("JPCP", "Canary", 10)]
    engine.dispose()
    assert diff(database_url) == []


def test_a_database_with_only_some_of_the_first_tables_is_refused_and_left_alone(database_url: str) -> None:
    engine = create_sql_engine(database_url)
    table_metadata().tables["trafficrule"].create(engine)
    engine.dispose()
    with pytest.raises(SchemaNotCurrent, match="trafficrule"):
        upgrade(database_url)
    assert tables(database_url) == {"trafficrule"}


def test_a_database_at_a_revision_this_release_does_not_know_is_refused(database_url: str, tmp_path: Path) -> None:
    upgrade(database_url)
    engine = create_sql_engine(database_url)
    with engine.begin() as connection:
        connection.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    engine.dispose()
    with pytest.raises(SchemaNotCurrent, match=r"9999, which this release does not know.*upgrade examlops"):
        upgrade(database_url)
    with pytest.raises(SchemaNotCurrent, match="upgrade examlops"):
        sql_engine(Settings(home=tmp_path, database_url=database_url))


def test_a_process_on_a_database_not_upgraded_is_told_to_run_exa_db_upgrade(database_url: str, tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, database_url=database_url)
    with pytest.raises(SchemaNotCurrent, match=r"no examlops tables: run `exa db upgrade`"):
        sql_engine(settings)
    assert tables(database_url) <= {"alembic_version"}  # an engine creates nothing
    upgrade_database(settings)
    sql_engine(settings).dispose()


def test_six_processes_upgrading_a_fresh_database_at_once_all_succeed_and_one_does_the_work(
    database_url: str,
) -> None:
    code = (
        "import sys, time; from examlops.db import upgrade; "
        "time.sleep(max(0.0, float(sys.argv[2]) - time.time())); print(upgrade(sys.argv[1]).before.status)"
    )
    start = time.time() + 4  # every process has imported alembic by then, and they upgrade together
    argv = [sys.executable, "-c", code, database_url, repr(start)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(6)]
    outputs = [proc.communicate(timeout=90) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 6, [err for _, err in outputs]
    assert sorted(out.strip() for out, _ in outputs) == ["current"] * 5 + ["empty"]
    assert diff(database_url) == []


def test_exa_db_upgrade_and_current_report_the_revision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from examlops.cli.main import app

    monkeypatch.setenv("EXAMLOPS_HOME", str(tmp_path))
    runner = CliRunner()
    before = runner.invoke(app, ["db", "current", "--json"])
    assert before.exit_code == 1
    assert json.loads(before.stdout)["status"] == "empty"
    done = runner.invoke(app, ["db", "upgrade", "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["after"] == json.loads(runner.invoke(app, ["db", "current", "--json"]).stdout)
    now = runner.invoke(app, ["db", "current"])
    assert now.exit_code == 0
    assert f"revision {head_revision()}, newest {head_revision()} (current)" in now.stdout


def test_exa_db_revision_writes_nothing_when_the_models_match_the_newest_revision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from examlops.cli.main import app

    monkeypatch.setenv("EXAMLOPS_HOME", str(tmp_path))
    result = CliRunner().invoke(app, ["db", "revision", "-m", "nothing new"])
    assert result.exit_code == 0, result.output
    assert "no migration written" in result.stdout
    assert not any(p.name.startswith("migration-") for p in tmp_path.iterdir())  # the scratch folder is gone


def test_an_upgrade_that_fails_midway_changes_nothing(database_url: str) -> None:
    engine = create_sql_engine(database_url)
    with engine.begin() as connection:  # the name of an index the first revision creates after four tables
        connection.exec_driver_sql("CREATE TABLE other (id INTEGER PRIMARY KEY, model VARCHAR)")
        connection.exec_driver_sql("CREATE INDEX ix_trafficchange_model ON other (model)")
    engine.dispose()
    with pytest.raises((StoreUnavailable, SchemaNotCurrent), match=r"failed, nothing changed.*ix_trafficchange_model"):
        upgrade(database_url)
    assert tables(database_url) == {"other"}
