"""The offline job table: one row per job (seed 001), with its progress and the lease of the runner.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "offline_job",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("identity", sa.String(), nullable=False),
        sa.Column("task", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("alias", sa.String(), nullable=False),
        sa.Column("budget_ms", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("instances_path", sa.String(), nullable=False),
        sa.Column("trace_id", sa.String(length=32), nullable=False),
        sa.Column("done_batches", sa.Integer(), nullable=False),
        sa.Column("answered", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("results_bytes", sa.BigInteger(), nullable=False),
        sa.Column("error", sa.String(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("owner", sa.String(), nullable=True),
        sa.Column("lease_until", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_offline_job_identity", "offline_job", ["identity"], unique=False)
    op.create_index("ix_offline_job_state", "offline_job", ["state"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_offline_job_state", table_name="offline_job")
    op.drop_index("ix_offline_job_identity", table_name="offline_job")
    op.drop_table("offline_job")
