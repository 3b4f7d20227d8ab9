"""Trace rows index only what is looked for: ``outcome`` where it is not ``answered``, ``task`` where one is set.

Every call's row updated all five trace indexes; most calls are answered, and a call by model name has no
task, so those two index entries were written for values `exa trace list` finds better by time (answered:
most rows) or never looks up (no task). Each index written costs the trace writer CPU on every row
(bench/RESULTS.md, issue 16). ``SqlTraceStore`` adds ``outcome <> 'answered'`` to an outcome filter for
another outcome, so SQLite uses the index (Postgres proves it anyway); a task filter implies ``task IS NOT
NULL``.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

OUTCOME_WHERE = "outcome <> 'answered'"
TASK_WHERE = "task IS NOT NULL"


def upgrade() -> None:
    op.drop_index("ix_trace_outcome", table_name="trace")
    op.drop_index("ix_trace_task", table_name="trace")
    for name, column, where in (("ix_trace_outcome", "outcome", OUTCOME_WHERE), ("ix_trace_task", "task", TASK_WHERE)):
        op.create_index(
            name, "trace", [column], unique=False, sqlite_where=sa.text(where), postgresql_where=sa.text(where)
        )


def downgrade() -> None:
    for name, column in (("ix_trace_outcome", "outcome"), ("ix_trace_task", "task")):
        op.drop_index(name, table_name="trace")
        op.create_index(name, "trace", [column], unique=False)
