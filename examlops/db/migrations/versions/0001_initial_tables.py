"""The tables as ``create_all`` made them before migrations: audit checkpoints, drift status, traffic.

A database made by that ``create_all`` is adopted by stamping it at this revision (``examlops.db.migrate``).

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "auditcheckpoint",
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("head_hash", sa.String(), nullable=False),
        sa.Column("signed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("hmac", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("seq"),
    )
    op.create_table(
        "driftstatus",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("version", sa.String(), nullable=False),
        sa.Column("drifted", sa.Boolean(), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("method", sa.String(), nullable=False),
        sa.Column("threshold", sa.Float(), nullable=False),
        sa.Column("columns", sa.String(), nullable=False),
        sa.Column("reference", sa.String(), nullable=False),
        sa.Column("reference_rows", sa.Integer(), nullable=False),
        sa.Column("current_rows", sa.Integer(), nullable=False),
        sa.Column("first_id", sa.String(), nullable=False),
        sa.Column("last_id", sa.String(), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("window_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("report_html", sa.String(), nullable=False),
        sa.Column("report_json", sa.String(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("model", "kind", "last_id"),
    )
    op.create_index("ix_driftstatus_model", "driftstatus", ["model"], unique=False)
    op.create_table(
        "trafficchange",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("weights", sa.String(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_trafficchange_model", "trafficchange", ["model"], unique=False)
    op.create_table(
        "trafficrule",
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("alias", sa.String(), nullable=False),
        sa.Column("weight", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("model", "alias"),
    )


def downgrade() -> None:
    op.drop_table("trafficrule")
    op.drop_index("ix_trafficchange_model", table_name="trafficchange")
    op.drop_table("trafficchange")
    op.drop_index("ix_driftstatus_model", table_name="driftstatus")
    op.drop_table("driftstatus")
    op.drop_table("auditcheckpoint")
