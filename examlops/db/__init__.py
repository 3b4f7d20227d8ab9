"""The examlops SQL database: engines, the schema under Alembic migrations, and where a database stands.

- ``create_sql_engine(url)``: an engine; it creates no table.
- ``upgrade(url)``: bring the database to the newest revision (locked; adopts a database made before
  migrations); `exa db upgrade` and `exa up` call it.
- ``require_current(engine, url)``: ``SchemaNotCurrent`` naming `exa db upgrade` unless the database is
  at the newest revision; every process checks this when it builds its engine.
- ``schema_state``, ``schema_diff``, ``new_revision``: for `exa db current`, the tests and maintainers.
"""

from examlops.db.engine import create_sql_engine, redacted
from examlops.db.migrate import Upgrade, upgrade
from examlops.db.revision import new_revision
from examlops.db.state import SchemaState, head_revision, require_current, schema_diff, schema_state

__all__ = [
    "SchemaState",
    "Upgrade",
    "create_sql_engine",
    "head_revision",
    "new_revision",
    "redacted",
    "require_current",
    "schema_diff",
    "schema_state",
    "upgrade",
]
