"""Initial schema: workloads and tuning_records.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create both tables, their unique keys and the top-k lookup index."""
    op.create_table(
        "workloads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("shash", sa.String(length=40), nullable=False),
        sa.Column("mod_sha256", sa.String(length=64), nullable=False),
        sa.Column("mod_json", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_workloads"),
        sa.UniqueConstraint("shash", "mod_sha256", name="uq_workloads_shash_mod_sha256"),
    )
    op.create_index("ix_workloads_shash", "workloads", ["shash"])
    op.create_table(
        "tuning_records",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("target_json", sa.Text(), nullable=False),
        sa.Column("target_hash", sa.String(length=64), nullable=False),
        sa.Column("units", sa.Integer(), nullable=False),
        sa.Column("unit_kind", sa.String(length=16), nullable=False),
        sa.Column("trace_json", sa.Text(), nullable=False),
        sa.Column("trace_sha256", sa.String(length=64), nullable=False),
        sa.Column("run_secs_json", sa.Text(), nullable=False),
        sa.Column("mean_latency_s", sa.Float(), nullable=True),
        sa.Column("blocks", sa.Integer(), nullable=True),
        sa.Column("args_info_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tool_version", sa.String(length=32), nullable=False),
        sa.ForeignKeyConstraint(
            ["workload_id"], ["workloads.id"],
            name="fk_tuning_records_workload_id_workloads", ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_tuning_records"),
        sa.UniqueConstraint(
            "workload_id", "target_hash", "units", "trace_sha256",
            name="uq_tuning_records_workload_id_target_hash_units_trace_sha256",
        ),
    )
    op.create_index(
        "ix_tuning_records_lookup", "tuning_records",
        ["workload_id", "target_hash", "units", "mean_latency_s"],
    )


def downgrade() -> None:
    """Drop everything."""
    op.drop_index("ix_tuning_records_lookup", table_name="tuning_records")
    op.drop_table("tuning_records")
    op.drop_index("ix_workloads_shash", table_name="workloads")
    op.drop_table("workloads")
