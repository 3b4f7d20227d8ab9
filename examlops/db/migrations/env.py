"""Alembic's environment: migrations run on the connection ``examlops.db`` passes in, never on their own."""

from alembic import context

from examlops.db.revision import render_item

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("examlops migrations run through `exa db upgrade` (examlops.db.upgrade), not the alembic CLI")
context.configure(
    connection=connection,
    target_metadata=context.config.attributes.get("target_metadata"),
    render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters a table by copying it
    render_item=render_item,
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
