"""Alembic's scripts for the examlops schema, run by ``examlops.db`` (never by the alembic CLI)."""
