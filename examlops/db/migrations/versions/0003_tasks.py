"""The task map: one row per task with the model, alias and adapter that answer it, and its bus address.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "taskmapping",
        sa.Column("task", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("alias", sa.String(), nullable=False),
        sa.Column("adapter", sa.String(), nullable=False),
        sa.Column("address", sa.String(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("task"),
        sa.UniqueConstraint("address"),
    )


def downgrade() -> None:
    op.drop_table("taskmapping")
