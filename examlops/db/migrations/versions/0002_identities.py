"""Identities and their keys (issue 16): ``identity`` and ``identity_key``.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "identity",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("role", sa.String(), nullable=False),
        sa.Column("tasks", sa.String(), nullable=False),
        sa.Column("models", sa.String(), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "identity_key",
        sa.Column("key_id", sa.String(), nullable=False),
        sa.Column("identity", sa.String(), nullable=False),
        sa.Column("secret_sha256", sa.String(), nullable=False),
        sa.Column("bus_key", sa.String(), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("not_after", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["identity"], ["identity.name"]),
        sa.PrimaryKeyConstraint("key_id"),
    )
    op.create_index(op.f("ix_identity_key_identity"), "identity_key", ["identity"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_identity_key_identity"), table_name="identity_key")
    op.drop_table("identity_key")
    op.drop_table("identity")
