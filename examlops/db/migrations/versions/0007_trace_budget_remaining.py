"""Traces record what was left of a call's budget: ``trace.budget_remaining_ms`` (NULL: no budget or deadline).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trace") as batch:
        batch.add_column(sa.Column("budget_remaining_ms", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trace") as batch:
        batch.drop_column("budget_remaining_ms")
