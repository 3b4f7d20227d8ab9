"""Task default budgets: the task map's ``budget_ms`` (milliseconds; NULL: a call without a budget has none).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("taskmapping") as batch:
        batch.add_column(sa.Column("budget_ms", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("taskmapping") as batch:
        batch.drop_column("budget_ms")
