"""``new_revision``: write the next migration from the difference between the newest revision and the models.

For maintainers, from a source checkout (the file lands in ``examlops/db/migrations/versions``). The
difference is taken against a scratch SQLite database upgraded to the newest revision, so no real
database is needed; read the generated file before committing it (Alembic cannot see renames).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import MetaData, TypeDecorator

from examlops.db.engine import create_sql_engine
from examlops.db.migrate import upgrade
from examlops.db.state import alembic_config, known_revisions, schema_diff

if TYPE_CHECKING:
    from alembic.autogenerate.api import AutogenContext


def render_item(kind: str, obj: Any, _context: AutogenContext) -> str | Literal[False]:
    """SQLModel's column types render as the SQLAlchemy types under them: migrations never import sqlmodel."""
    if kind == "type" and isinstance(obj, TypeDecorator) and type(obj).__module__.startswith("sqlmodel"):
        return f"sa.{obj.impl_instance!r}"
    return False


def new_revision(metadata: MetaData, message: str, scratch: Path) -> Path | None:
    """The path of the new migration file, or ``None`` when the models match the newest revision."""
    from alembic import command

    url = f"sqlite:///{scratch / 'schema.db'}"
    upgrade(url)
    engine = create_sql_engine(url)
    try:
        with engine.connect() as connection:
            if not schema_diff(connection, metadata):
                return None
            config = alembic_config(connection, metadata)
            # The file is formatted as the rest of the code (ruff is a dev dependency, as this command is).
            config.set_section_option("post_write_hooks", "hooks", "ruff")
            config.set_section_option("post_write_hooks", "ruff.type", "module")
            config.set_section_option("post_write_hooks", "ruff.module", "ruff")
            config.set_section_option("post_write_hooks", "ruff.options", "format REVISION_SCRIPT_FILENAME")
            rev_id = f"{len(known_revisions()) + 1:04d}"
            script = command.revision(config, message=message, autogenerate=True, rev_id=rev_id)
    finally:
        engine.dispose()
    assert script is not None and not isinstance(script, list)
    return Path(script.path)
