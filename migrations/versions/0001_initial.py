"""Initial warm-state schema.

Boxes and epochs, agents and prefix versions, warm records, restart phases, campaigns, webhook
idempotency keys and the append-only event log.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agents",
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("spec_hash", sa.String(length=128), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agents")),
    )
    op.create_table(
        "boxes",
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("base_url", sa.String(length=2000), nullable=False),
        sa.Column("engine", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("group", sa.String(length=200), nullable=False),
        sa.Column("cache_capacity_tokens", sa.BigInteger(), nullable=True),
        sa.Column("current_epoch", sa.String(length=200), nullable=True),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_boxes")),
    )
    op.create_table(
        "campaigns",
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("agent_id", sa.String(length=200), nullable=False),
        sa.Column("starts_at", sa.Double(), nullable=False),
        sa.Column("ends_at", sa.Double(), nullable=False),
        sa.Column("expected_calls", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_campaigns")),
    )
    op.create_index(op.f("ix_campaigns_agent_id"), "campaigns", ["agent_id"], unique=False)
    op.create_table(
        "events",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("box_id", sa.String(length=200), nullable=True),
        sa.Column("agent_id", sa.String(length=200), nullable=True),
        sa.Column("epoch", sa.String(length=200), nullable=True),
        sa.Column("prefix_hash", sa.String(length=64), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index("ix_events_box_id_id", "events", ["box_id", "id"], unique=False)
    op.create_table(
        "webhook_events",
        sa.Column("event_id", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("body_sha256", sa.String(length=64), nullable=False),
        sa.Column("received_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_webhook_events")),
    )
    op.create_table(
        "box_epochs",
        sa.Column("box_id", sa.String(length=200), nullable=False),
        sa.Column("epoch", sa.String(length=200), nullable=False),
        sa.Column("first_seen_at", sa.Double(), nullable=False),
        sa.Column("last_seen_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["box_id"], ["boxes.id"], name=op.f("fk_box_epochs_box_id_boxes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("box_id", "epoch", name=op.f("pk_box_epochs")),
    )
    op.create_table(
        "prefix_versions",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("agent_id", sa.String(length=200), nullable=False),
        sa.Column("spec_hash", sa.String(length=128), nullable=False),
        sa.Column("prefix_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix_tokens", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("engine_version", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"], ["agents.id"], name=op.f("fk_prefix_versions_agent_id_agents"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_prefix_versions")),
        sa.UniqueConstraint(
            "agent_id",
            "prefix_hash",
            "model",
            "engine_version",
            name=op.f("uq_prefix_versions_agent_id_prefix_hash_model_engine_version"),
        ),
    )
    op.create_index(op.f("ix_prefix_versions_agent_id"), "prefix_versions", ["agent_id"], unique=False)
    op.create_index(op.f("ix_prefix_versions_prefix_hash"), "prefix_versions", ["prefix_hash"], unique=False)
    op.create_table(
        "restart_phases",
        sa.Column("box_id", sa.String(length=200), nullable=False),
        sa.Column("epoch", sa.String(length=200), nullable=False),
        sa.Column("phase", sa.String(length=32), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=False),
        sa.Column("finished_at", sa.Double(), nullable=True),
        sa.Column("engine_seconds", sa.Double(), nullable=True),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["box_id", "epoch"],
            ["box_epochs.box_id", "box_epochs.epoch"],
            name=op.f("fk_restart_phases_box_id_epoch_box_epochs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("box_id", "epoch", "phase", name=op.f("pk_restart_phases")),
    )
    op.create_table(
        "warm_records",
        sa.Column("box_id", sa.String(length=200), nullable=False),
        sa.Column("epoch", sa.String(length=200), nullable=False),
        sa.Column("prefix_hash", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("prefix_tokens", sa.Integer(), nullable=False),
        sa.Column("verified_cached_tokens", sa.Integer(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.Column("warmed_at", sa.Double(), nullable=True),
        sa.Column("verified_at", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["box_id", "epoch"],
            ["box_epochs.box_id", "box_epochs.epoch"],
            name=op.f("fk_warm_records_box_id_epoch_box_epochs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("box_id", "epoch", "prefix_hash", name=op.f("pk_warm_records")),
    )


def downgrade() -> None:
    op.drop_table("warm_records")
    op.drop_table("restart_phases")
    op.drop_table("prefix_versions")
    op.drop_table("box_epochs")
    op.drop_table("webhook_events")
    op.drop_table("events")
    op.drop_table("campaigns")
    op.drop_table("boxes")
    op.drop_table("agents")
