"""The trace table: one row per HTTP or bus call (issue 16), indexed on time, identity, task, model, outcome.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "trace",
        sa.Column("trace_id", sa.String(length=32), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("channel", sa.String(), nullable=False),
        sa.Column("outcome", sa.String(), nullable=False),
        sa.Column("error_code", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=True),
        sa.Column("alias", sa.String(), nullable=True),
        sa.Column("version", sa.String(), nullable=True),
        sa.Column("adapter", sa.String(), nullable=True),
        sa.Column("identity", sa.String(), nullable=True),
        sa.Column("task", sa.String(), nullable=True),
        sa.Column("budget_ms", sa.Float(), nullable=True),
        sa.Column("used_ms", sa.Float(), nullable=False),
        sa.Column("node", sa.String(), nullable=False),
        sa.Column("batch_id", sa.String(), nullable=True),
        sa.Column("batch_size", sa.Integer(), nullable=True),
        sa.Column("queue_wait_ms", sa.Float(), nullable=True),
        sa.Column("predict_ms", sa.Float(), nullable=True),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(), nullable=True),
        sa.Column("input", sa.String(), nullable=False),
        sa.Column("output", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("trace_id"),
    )
    op.create_index("ix_trace_at", "trace", ["at"], unique=False)
    op.create_index("ix_trace_identity", "trace", ["identity"], unique=False)
    op.create_index("ix_trace_task", "trace", ["task"], unique=False)
    op.create_index("ix_trace_model", "trace", ["model"], unique=False)
    op.create_index("ix_trace_outcome", "trace", ["outcome"], unique=False)


def downgrade() -> None:
    for name in ("ix_trace_outcome", "ix_trace_model", "ix_trace_task", "ix_trace_identity", "ix_trace_at"):
        op.drop_index(name, table_name="trace")
    op.drop_table("trace")
