"""Health polled by a box's lease holder only: its observations, shared with the other replicas.

`box_observations` holds each box's health and epoch as its holder last saw them, written when they
change; `replicas.polled_at` is the holder's stamp of its last poll round over every box it holds, so a
reader tells a current observation from a stale one with one row per replica, not one per box
(`warmer.core.observations`).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("replicas") as batch:
        batch.add_column(sa.Column("polled_at", sa.Double(), nullable=True))
    op.create_table(
        "box_observations",
        sa.Column("box_id", sa.String(length=200), nullable=False),
        sa.Column("observer", sa.String(length=200), nullable=False),
        sa.Column("healthy", sa.Boolean(), nullable=False),
        sa.Column("epoch", sa.String(length=200), nullable=True),
        sa.Column("failure", sa.String(length=32), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("changed_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("box_id", name=op.f("pk_box_observations")),
    )


def downgrade() -> None:
    op.drop_table("box_observations")
    with op.batch_alter_table("replicas") as batch:
        batch.drop_column("polled_at")
