"""Several replicas on one database: replica heartbeats, box leases, shared rollout state and fleet changes.

`replicas` and `box_leases` decide which replica sends each box its engine work (`warmer.core.leases`);
`rollout_state` and `fleet_changes` hold what deploy events changed, so every replica (and a restarted
daemon) applies them (`warmer.core.shared_state`). No foreign keys to `boxes`: these rows outlive a box's
removal harmlessly and never block it.

Revision ID: 0003
Revises: 0002
Create Date: 2025-01-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=False),
        sa.Column("heartbeat_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_replicas")),
    )
    op.create_table(
        "box_leases",
        sa.Column("box_id", sa.String(length=200), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=True),
        sa.Column("acquired_at", sa.Double(), nullable=True),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.Column("renewed_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("box_id", name=op.f("pk_box_leases")),
    )
    op.create_index(op.f("ix_box_leases_owner"), "box_leases", ["owner"], unique=False)
    op.create_table(
        "rollout_state",
        sa.Column("box_id", sa.String(length=200), nullable=False),
        sa.Column("drain_reason", sa.Text(), nullable=True),
        sa.Column("epoch_tag", sa.String(length=200), nullable=True),
        sa.Column("event_id", sa.String(length=200), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("box_id", name=op.f("pk_rollout_state")),
    )
    op.create_table(
        "fleet_changes",
        sa.Column("box_id", sa.String(length=200), nullable=False),
        sa.Column("added", sa.JSON(), nullable=True),
        sa.Column("event_id", sa.String(length=200), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("box_id", name=op.f("pk_fleet_changes")),
    )


def downgrade() -> None:
    op.drop_table("fleet_changes")
    op.drop_table("rollout_state")
    op.drop_index(op.f("ix_box_leases_owner"), table_name="box_leases")
    op.drop_table("box_leases")
    op.drop_table("replicas")
