"""Where a database stands, from its version row and its tables, and what the message tells the user."""

from __future__ import annotations

import pytest

from examlops.core.errors import ConfigError
from examlops.db.engine import create_sql_engine, normalize_url, redacted, sqlite_file
from examlops.db.state import FIRST_TABLES, SchemaState, head_revision

ALL = tuple(sorted(FIRST_TABLES))


@pytest.mark.parametrize(
    ("revision", "tables", "status", "says"),
    [
        (head_revision(), ALL, "current", ""),
        (None, (), "empty", "run `exa db upgrade`"),
        (None, ("mlflow_runs",), "empty", "run `exa db upgrade`"),
        (None, (*ALL, "other"), "unversioned", "created before schema migrations: run `exa db upgrade`"),
        (None, ("trafficrule",), "partial", "some examlops tables (trafficrule)"),
        ("9999", ALL, "unknown", "revision 9999, which this release does not know"),
    ],
)
def test_the_status_and_the_message_follow_the_version_row_and_the_tables(
    revision: str | None, tables: tuple[str, ...], status: str, says: str
) -> None:
    state = SchemaState("sqlite:///x.db", revision, head_revision(), tables)
    assert state.status == status
    assert says in state.problem() if says else state.problem() == ""


def test_postgres_urls_without_a_driver_use_psycopg_3_and_passwords_are_hidden() -> None:
    assert normalize_url("postgresql://u:secret@h/db").drivername == "postgresql+psycopg"
    assert normalize_url("postgresql+psycopg2://u@h/db").drivername == "postgresql+psycopg2"
    assert redacted("postgresql://u:secret@h/db") == "postgresql+psycopg://u:***@h/db"


def test_only_a_sqlite_url_with_a_file_has_a_file() -> None:
    assert str(sqlite_file("sqlite:////tmp/x/examlops.db")) == "/tmp/x/examlops.db"
    assert sqlite_file("sqlite://") is None
    assert sqlite_file("sqlite:///:memory:") is None
    assert sqlite_file("postgresql://u@h/db") is None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("not a url", "is not a database URL"),
        ("bogus://x", "cannot use (bogus)"),
        ("mysql://u@h/db", "needs the Python module MySQLdb"),
    ],
)
def test_a_database_url_examlops_cannot_use_is_a_config_error_naming_the_setting(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match="EXAMLOPS_DATABASE_URL") as raised:
        create_sql_engine(url)
    assert says in str(raised.value)
