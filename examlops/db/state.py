"""Where a database stands against the migrations: ``read_state`` and ``require_current``.

``require_current(engine, url)`` returns when the database is at the newest revision and raises
``SchemaNotCurrent`` otherwise, with the command that fixes it (`exa db upgrade`, or a newer examlops
for a database a newer release migrated); an unreachable database is ``StoreUnavailable``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy
from sqlalchemy import Connection, MetaData
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from examlops.core.errors import SchemaNotCurrent, StoreUnavailable
from examlops.db.engine import redacted

if TYPE_CHECKING:  # alembic is slow to import: only processes that touch SQL pay for it
    from alembic.config import Config
    from alembic.script import ScriptDirectory

MIGRATIONS = Path(__file__).parent / "migrations"
FIRST_REVISION = "0001"
FIRST_TABLES = frozenset({"auditcheckpoint", "driftstatus", "trafficchange", "trafficrule"})
"""The tables the first revision creates: what ``create_all`` made before migrations existed."""
VERSION_TABLE = "alembic_version"


def alembic_config(connection: Connection | None = None, metadata: MetaData | None = None) -> Config:
    """Alembic's configuration, built in code: the scripts inside the package, no alembic.ini."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    config.set_main_option("path_separator", "os")
    config.attributes["connection"] = connection
    config.attributes["target_metadata"] = metadata
    return config


@functools.cache
def _scripts() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest revision of this release."""
    head = _scripts().get_current_head()
    assert head is not None, "the migrations have more than one head"
    return head


def known_revisions() -> frozenset[str]:
    return frozenset(script.revision for script in _scripts().walk_revisions())


@dataclass(frozen=True, slots=True)
class SchemaState:
    url: str
    """The database, its password hidden."""
    revision: str | None
    """What ``alembic_version`` says; ``None`` when it is missing."""
    head: str
    tables: tuple[str, ...]
    """Every table in the database but ``alembic_version``."""

    @property
    def status(self) -> str:
        """current, behind, empty (no tables of ours), unversioned (made by create_all before migrations),
        partial (some of those tables, no version) or unknown (a revision this release does not know)."""
        if self.revision == self.head:
            return "current"
        if self.revision is not None:
            return "behind" if self.revision in known_revisions() else "unknown"
        ours = FIRST_TABLES & set(self.tables)
        if not ours:
            return "empty"
        return "unversioned" if ours == FIRST_TABLES else "partial"

    def problem(self) -> str:
        """What is wrong and what to run; empty when the schema is current."""
        where = f"the SQL database at {self.url}"
        return {
            "current": "",
            "empty": f"{where} has no examlops tables: run `exa db upgrade` (`exa up` runs it too)",
            "unversioned": f"{where} was created before schema migrations: run `exa db upgrade` to adopt it",
            "behind": f"{where} is at schema revision {self.revision}, this release needs {self.head}: "
            "run `exa db upgrade`",
            "partial": f"{where} has some examlops tables ({', '.join(sorted(FIRST_TABLES & set(self.tables)))}) "
            f"but no {VERSION_TABLE} and not all of {', '.join(sorted(FIRST_TABLES))}: "
            "drop them or restore a complete copy, then run `exa db upgrade`",
            "unknown": f"{where} is at schema revision {self.revision}, which this release does not know "
            "(a newer examlops migrated it): upgrade examlops",
        }[self.status]

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "revision": self.revision, "head": self.head, "status": self.status}


def read_state(connection: Connection, url: str) -> SchemaState:
    names = set(sqlalchemy.inspect(connection).get_table_names())
    revision = None
    if VERSION_TABLE in names:  # read as Alembic writes it; several rows (branches) are a revision we do not know
        rows = connection.execute(sqlalchemy.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
        revision = ",".join(sorted(rows)) or None
    return SchemaState(redacted(url), revision, head_revision(), tuple(sorted(names - {VERSION_TABLE})))


def schema_state(engine: Engine, url: str) -> SchemaState:
    """Where the database stands; ``StoreUnavailable`` when it cannot be reached."""
    try:
        with engine.connect() as connection:
            return read_state(connection, url)
    except OperationalError as exc:
        raise StoreUnavailable(f"cannot read the SQL schema at {redacted(url)}: {exc.orig}") from exc


def require_current(engine: Engine, url: str) -> None:
    """Return when the database is at the newest revision; else ``SchemaNotCurrent`` saying what to run."""
    state = schema_state(engine, url)
    if state.status != "current":
        raise SchemaNotCurrent(state.problem())


def schema_diff(connection: Connection, metadata: MetaData) -> list[Any]:
    """Alembic's autogenerate diff between the database and ``metadata``: empty when they agree."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return list(compare_metadata(context, metadata))
