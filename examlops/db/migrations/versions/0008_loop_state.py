"""The closed loop's records: ``loop_state``, one row per model (where its loop stands, who holds it).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "loop_state",
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("phase", sa.String(), nullable=False),
        sa.Column("owner", sa.String(), nullable=True),
        sa.Column("run", sa.String(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("canary_version", sa.String(), nullable=True),
        sa.Column("production_version", sa.String(), nullable=True),
        sa.Column("share", sa.Integer(), nullable=False),
        sa.Column("restore", sa.String(), nullable=False),
        sa.Column("figures", sa.String(), nullable=False),
        sa.Column("note", sa.String(), nullable=False),
        sa.Column("promoted_at", sa.Float(), nullable=True),
        sa.Column("replaced_version", sa.String(), nullable=True),
        sa.Column("abort_requested", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("model"),
    )


def downgrade() -> None:
    op.drop_table("loop_state")
