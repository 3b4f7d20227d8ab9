"""The SQL schema is created once, whichever of several processes starting at once gets there first."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy.exc import OperationalError
from sqlmodel import SQLModel

from examlops.bootstrap import sql_engine
from examlops.core.settings import Settings

pytestmark = pytest.mark.integration

EXPECTED = {"auditcheckpoint", "driftstatus", "trafficrule", "trafficchange"}


def tables(settings: Settings) -> set[str]:
    return set(sqlalchemy.inspect(sql_engine(settings)).get_table_names())


def test_a_table_another_process_created_meanwhile_is_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_all = SQLModel.metadata.create_all
    calls: list[int] = []

    def racing(bind: sqlalchemy.Engine, **kwargs: object) -> None:
        calls.append(1)
        if len(calls) == 1:  # another process created the tables between our check and our CREATE
            create_all(bind)
            raise OperationalError(
                "CREATE TABLE auditcheckpoint", {}, Exception("table auditcheckpoint already exists")
            )
        create_all(bind, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(SQLModel.metadata, "create_all", racing)
    assert tables(Settings(home=tmp_path)) >= EXPECTED
    assert len(calls) == 2


def test_other_database_errors_are_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(bind: sqlalchemy.Engine, **kwargs: object) -> None:
        raise OperationalError("CREATE TABLE x", {}, Exception("disk I/O error"))

    monkeypatch.setattr(SQLModel.metadata, "create_all", broken)
    with pytest.raises(OperationalError, match="disk I/O error"):
        sql_engine(Settings(home=tmp_path))


def test_six_processes_creating_the_schema_at_once_all_succeed(tmp_path: Path) -> None:
    code = (
        "import sys, time; from examlops.bootstrap import sql_engine; from examlops.core.settings import Settings; "
        "time.sleep(max(0.0, float(sys.argv[2]) - time.time())); sql_engine(Settings(home=sys.argv[1]))"
    )
    start = time.time() + 4  # every process has imported sqlmodel by then, and they create the tables together
    argv = [sys.executable, "-c", code, str(tmp_path), repr(start)]
    procs = [subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) for _ in range(6)]
    errors = [proc.communicate(timeout=60)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 6, errors
    assert tables(Settings(home=tmp_path)) >= EXPECTED
