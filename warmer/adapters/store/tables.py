"""The warm-state schema: SQLAlchemy 2 typed tables, the single source the migrations must agree with.

Timestamps are unix seconds as double-precision floats, exactly as the domain (`warmer.core.model`)
carries them, so nothing converts time zones at the boundary and SQLite and PostgreSQL store the same
numbers. Enumerations (engine kind, warm state, phase) are plain strings: adding a state must not need a
table rebuild on SQLite.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Named constraints: Alembic batch mode on SQLite recreates tables and can only drop or alter a
# constraint it can name; PostgreSQL then gets the same names.
NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a 64-bit identity for the log.
EVENT_ID_TYPE = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class BoxRow(Base):
    """A configured engine box; `current_epoch` is the epoch its warm state belongs to now."""

    __tablename__ = "boxes"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    base_url: Mapped[str] = mapped_column(String(2000))
    engine: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(200))
    slots: Mapped[int] = mapped_column(Integer)
    group: Mapped[str] = mapped_column(String(200), default="")
    cache_capacity_tokens: Mapped[int | None] = mapped_column(BigInteger)
    current_epoch: Mapped[str | None] = mapped_column(String(200))
    updated_at: Mapped[float] = mapped_column(Double)


class BoxEpochRow(Base):
    """Every epoch (engine process identity) a box has been seen with; warm state hangs off these."""

    __tablename__ = "box_epochs"

    box_id: Mapped[str] = mapped_column(
        String(200), ForeignKey("boxes.id", ondelete="CASCADE"), primary_key=True
    )
    epoch: Mapped[str] = mapped_column(String(200), primary_key=True)
    first_seen_at: Mapped[float] = mapped_column(Double)
    last_seen_at: Mapped[float] = mapped_column(Double)


class AgentRow(Base):
    """An agent and the hash of the spec version the daemon last computed prefixes from."""

    __tablename__ = "agents"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    spec_hash: Mapped[str] = mapped_column(String(128))
    updated_at: Mapped[float] = mapped_column(Double)


class PrefixVersionRow(Base):
    """One stable prefix an agent spec produced for one model on one engine version.

    Unique per agent as well as per (prefix, model, engine version): two agents with byte-identical
    prefixes share one cache entry on the engine, but each keeps its own history row here.
    `text_hash` is the prefix TEXT's identity (`prefix_hash(text)` without ids): tokenizer drift is looked
    up by it, since `prefix_hash` (over token ids) changes exactly when the tokenizer does. NULL on rows
    written before revision 0002.
    """

    __tablename__ = "prefix_versions"
    __table_args__ = (
        UniqueConstraint("agent_id", "prefix_hash", "model", "engine_version"),
        Index("ix_prefix_versions_model_text_hash", "model", "text_hash"),
    )

    id: Mapped[int] = mapped_column(EVENT_ID_TYPE, primary_key=True, autoincrement=True)
    agent_id: Mapped[str] = mapped_column(
        String(200), ForeignKey("agents.id", ondelete="CASCADE"), index=True
    )
    spec_hash: Mapped[str] = mapped_column(String(128))
    prefix_hash: Mapped[str] = mapped_column(String(64), index=True)
    prefix_tokens: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(200))
    engine_version: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[float] = mapped_column(Double)
    text_hash: Mapped[str | None] = mapped_column(String(64))


class WarmRecordRow(Base):
    """Warm state of one prefix on one box in one epoch; dies with the epoch (cascade)."""

    __tablename__ = "warm_records"
    __table_args__ = (
        ForeignKeyConstraint(
            ["box_id", "epoch"], ["box_epochs.box_id", "box_epochs.epoch"], ondelete="CASCADE"
        ),
    )

    box_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    epoch: Mapped[str] = mapped_column(String(200), primary_key=True)
    prefix_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    prefix_tokens: Mapped[int] = mapped_column(Integer)
    verified_cached_tokens: Mapped[int | None] = mapped_column(Integer)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[float] = mapped_column(Double)
    warmed_at: Mapped[float | None] = mapped_column(Double)
    verified_at: Mapped[float | None] = mapped_column(Double)


class RestartPhaseRow(Base):
    """One timed phase of a box's restart warm-up in one epoch."""

    __tablename__ = "restart_phases"
    __table_args__ = (
        ForeignKeyConstraint(
            ["box_id", "epoch"], ["box_epochs.box_id", "box_epochs.epoch"], ondelete="CASCADE"
        ),
    )

    box_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    epoch: Mapped[str] = mapped_column(String(200), primary_key=True)
    phase: Mapped[str] = mapped_column(String(32), primary_key=True)
    started_at: Mapped[float] = mapped_column(Double)
    finished_at: Mapped[float | None] = mapped_column(Double)
    engine_seconds: Mapped[float | None] = mapped_column(Double)
    requests: Mapped[int] = mapped_column(Integer, default=0)
    ok: Mapped[bool | None] = mapped_column()
    error: Mapped[str | None] = mapped_column(Text)


class CampaignRow(Base):
    """A dialer schedule entry. No foreign key to agents: the dialer may book an agent before the
    daemon has computed its prefix."""

    __tablename__ = "campaigns"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    agent_id: Mapped[str] = mapped_column(String(200), index=True)
    starts_at: Mapped[float] = mapped_column(Double)
    ends_at: Mapped[float] = mapped_column(Double)
    expected_calls: Mapped[int] = mapped_column(Integer, default=0)


class WebhookEventRow(Base):
    """Received webhook ids: the primary key is what makes redelivery idempotent."""

    __tablename__ = "webhook_events"

    event_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    kind: Mapped[str] = mapped_column(String(64))
    body_sha256: Mapped[str] = mapped_column(String(64))
    received_at: Mapped[float] = mapped_column(Double)


class EventRow(Base):
    """The append-only history. No foreign keys, so it outlives the boxes and epochs it mentions."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_box_id_id", "box_id", "id"),)

    id: Mapped[int] = mapped_column(EVENT_ID_TYPE, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Double)
    kind: Mapped[str] = mapped_column(String(64))
    box_id: Mapped[str | None] = mapped_column(String(200))
    agent_id: Mapped[str | None] = mapped_column(String(200))
    epoch: Mapped[str | None] = mapped_column(String(200))
    prefix_hash: Mapped[str | None] = mapped_column(String(64))
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class ReplicaRow(Base):
    """A running daemon on this database; live while `expires_at` (database clock) is ahead. Renewed with
    its box leases, so a replica and its leases expire together."""

    __tablename__ = "replicas"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    started_at: Mapped[float] = mapped_column(Double)
    heartbeat_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float] = mapped_column(Double)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # database clock of its last poll round that covered every box it holds (`warmer.core.observations`)
    polled_at: Mapped[float | None] = mapped_column(Double)


class BoxObservationRow(Base):
    """A box's health as the replica holding its lease last saw it (`warmer.core.observations`): written
    when it changes, trusted while `observer` holds the lease and its replica row's `polled_at` is recent.
    No foreign key, like the leases: it never blocks removing a box."""

    __tablename__ = "box_observations"

    box_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    observer: Mapped[str] = mapped_column(String(200))
    healthy: Mapped[bool] = mapped_column()
    epoch: Mapped[str | None] = mapped_column(String(200))
    failure: Mapped[str | None] = mapped_column(String(32))
    error: Mapped[str | None] = mapped_column(Text)
    changed_at: Mapped[float] = mapped_column(Double)  # database clock


class BoxLeaseRow(Base):
    """Which replica sends a box its engine work (`warmer.core.leases`). `owner` NULL: released. No foreign
    key: a lease row is ignored once its box leaves the fleet, and never blocks removing the box."""

    __tablename__ = "box_leases"

    box_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    owner: Mapped[str | None] = mapped_column(String(200), index=True)
    acquired_at: Mapped[float | None] = mapped_column(Double)  # the holder's clock
    expires_at: Mapped[float] = mapped_column(Double)  # the database's clock
    renewed_at: Mapped[float | None] = mapped_column(Double)


class RolloutStateRow(Base):
    """A box's rollout drain and epoch tag (`warmer.core.shared_state.RolloutMark`), shared by replicas."""

    __tablename__ = "rollout_state"

    box_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    drain_reason: Mapped[str | None] = mapped_column(Text)
    epoch_tag: Mapped[str | None] = mapped_column(String(200))
    event_id: Mapped[str] = mapped_column(String(200))
    updated_at: Mapped[float] = mapped_column(Double)


class FleetChangeRow(Base):
    """The latest webhook fleet change of a box: `added` holds its spec, NULL when it was removed."""

    __tablename__ = "fleet_changes"

    box_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    added: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    event_id: Mapped[str] = mapped_column(String(200))
    at: Mapped[float] = mapped_column(Double)


metadata = Base.metadata
