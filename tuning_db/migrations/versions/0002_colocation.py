"""Colocation profiles: interference per unit time of candidate-kernel pairs (tvmsched profile-coloc).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
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
        "colocation",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("device", sa.String(length=128), nullable=False),
        sa.Column("first", sa.Text(), nullable=False),
        sa.Column("second", sa.Text(), nullable=False),
        sa.Column("isolated_us", sa.Float(), nullable=False),
        sa.Column("colocated_us", sa.Float(), nullable=False),
        sa.Column("overhead", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_colocation"),
    )
    op.create_index("ix_colocation_device", "colocation", ["device"])


def downgrade() -> None:
    op.drop_index("ix_colocation_device", table_name="colocation")
    op.drop_table("colocation")
