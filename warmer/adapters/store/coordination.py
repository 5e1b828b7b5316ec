"""`SqlCoordination`: what several replicas on one database share beyond warm state (the CoordinationPort).

Box leases are rows (`box_leases`), taken with `SELECT ... FOR UPDATE SKIP LOCKED` and renewed by heartbeat,
not PostgreSQL advisory locks. Why rows:
- a lease has an explicit expiry on the database's clock, so a holder that is frozen, partitioned or slow
  (its TCP connection still open) loses its boxes within `lease_seconds`; a session advisory lock is held
  for as long as its connection lives, however stuck the process is;
- the holder keeps its leases across a reconnect (a pooled connection replaced by `pool_pre_ping`, a
  database blip shorter than the lease), where session locks vanish silently with their connection;
- ownership is data every replica can read: the fair share counts live replicas, the API says who holds
  what, a box's `acquired_at` says which verifications the current holder made itself;
- the same table works on SQLite (one replica: every lease trivially held; SQLite has no row locks, its
  single writer serialises the heartbeats).
SKIP LOCKED lets replicas racing for free boxes split them instead of queueing on each other: a row another
heartbeat is taking is skipped, and the predicate (free or expired) is re-checked on the row locked.

Writes that other replicas should see at once (leases taken or released, deploy state) also
`pg_notify(CHANGES_CHANNEL)` in their transaction, delivered on commit; the listener
(`warmer.adapters.store.notify`) wakes the other replicas' loops. The store stays the truth: a missed
notification only delays a change to the next pass.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from sqlalchemy import delete, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from warmer.adapters.store.store import SqlStore
from warmer.adapters.store.tables import (
    BoxLeaseRow,
    FleetChangeRow,
    ReplicaRow,
    RolloutStateRow,
    WebhookEventRow,
)
from warmer.core.errors import StoreError
from warmer.core.leases import Lease, LeaseConfig, LeaseView, decide
from warmer.core.model import PhaseRecord
from warmer.core.shared_state import (
    FleetChange,
    RolloutMark,
    SharedFleetState,
    StateChange,
    box_from_data,
    box_to_data,
)

CHANGES_CHANNEL = "warmer_changes"


class SqlCoordination:
    """Leases, replica membership and shared deploy state, over the tables and connections of `store`."""

    def __init__(self, store: SqlStore) -> None:
        self._store = store

    @property
    def notifies(self) -> bool:
        """True when other replicas can be woken (PostgreSQL LISTEN/NOTIFY)."""
        return self._store.dialect == "postgresql"

    # -- leases -------------------------------------------------------------------------------------

    async def heartbeat(
        self,
        replica_id: str,
        boxes: Sequence[str],
        *,
        at: float,
        config: LeaseConfig,
        detail: Mapping[str, object] | None = None,
        busy: Collection[str] = (),
    ) -> LeaseView:
        """One heartbeat of `replica_id` over the fleet `boxes`, in one transaction: renew its replica row
        and the leases it keeps, release its excess (never a `busy` one), take free boxes up to its fair
        share (`warmer.core.leases.decide`). `at` is the replica's clock (stamped as `acquired_at`).
        Returns the leases and live replicas as the transaction left them."""
        if not replica_id:
            raise StoreError("replica_id: must not be empty")
        fleet = sorted(set(boxes))
        info = dict(detail or {})

        def work(session: Session) -> LeaseView:
            now = self._store.db_now(session)
            until = now + config.lease_seconds
            self._store._upsert(
                session,
                ReplicaRow,
                {
                    "id": replica_id,
                    "started_at": at,
                    "heartbeat_at": now,
                    "expires_at": until,
                    "detail": info,
                },
                keys=["id"],
                update=["heartbeat_at", "expires_at", "detail"],
            )
            view = self._view(session, now, fleet)
            for box_id in fleet:
                if box_id not in view.leases:
                    self._store._insert_if_absent(
                        session,
                        BoxLeaseRow,
                        {"box_id": box_id, "owner": None, "acquired_at": None, "expires_at": 0.0},
                        keys=["box_id"],
                    )
            decision = decide(replica_id, fleet, view, busy)
            changed = False
            if decision.release:
                session.execute(
                    update(BoxLeaseRow)
                    .where(BoxLeaseRow.owner == replica_id, BoxLeaseRow.box_id.in_(decision.release))
                    .values(owner=None, expires_at=now, renewed_at=now)
                )
                changed = True
            if decision.renew:
                session.execute(
                    update(BoxLeaseRow)
                    .where(
                        BoxLeaseRow.owner == replica_id,
                        BoxLeaseRow.expires_at > now,
                        BoxLeaseRow.box_id.in_(decision.renew),
                    )
                    .values(expires_at=until, renewed_at=now)
                )
            if decision.take:
                free = session.scalars(
                    select(BoxLeaseRow.box_id)
                    .where(
                        BoxLeaseRow.box_id.in_(decision.take),
                        (BoxLeaseRow.owner.is_(None)) | (BoxLeaseRow.expires_at <= now),
                    )
                    .with_for_update(skip_locked=True)
                ).all()
                if free:
                    # Trust carries over (acquired_at kept) when the holding is continuous: taken back by
                    # the replica whose lease lapsed, nobody having held it since, or handed over by a live
                    # holder (released, never mid-work). A lease that expired under another replica, or a
                    # first one, starts a new holding: what was verified before it is re-probed.
                    session.execute(
                        update(BoxLeaseRow)
                        .where(
                            BoxLeaseRow.box_id.in_(list(free)),
                            (BoxLeaseRow.owner == replica_id)
                            | (BoxLeaseRow.owner.is_(None) & BoxLeaseRow.acquired_at.is_not(None)),
                        )
                        .values(owner=replica_id, expires_at=until, renewed_at=now)
                    )
                    session.execute(
                        update(BoxLeaseRow)
                        .where(
                            BoxLeaseRow.box_id.in_(list(free)),
                            BoxLeaseRow.owner.is_(None) | (BoxLeaseRow.owner != replica_id),
                        )
                        .values(owner=replica_id, acquired_at=at, expires_at=until, renewed_at=now)
                    )
                    changed = True
            if changed:
                self._notify(session, "leases")
            return self._view(session, now, fleet)

        return await self._store._run(work, write=True, lane=True)

    async def release(self, replica_id: str, *, leave: bool = True) -> None:
        """Give back every lease of `replica_id` at once (a graceful stop), and with `leave` its replica
        row: survivors recount their fair share and take the boxes at their next heartbeat."""

        def work(session: Session) -> None:
            now = self._store.db_now(session)
            session.execute(
                update(BoxLeaseRow)
                .where(BoxLeaseRow.owner == replica_id)
                .values(owner=None, expires_at=now, renewed_at=now)
            )
            if leave:
                session.execute(delete(ReplicaRow).where(ReplicaRow.id == replica_id))
            self._notify(session, "leases")

        await self._store._run(work, write=True, lane=True)

    async def lease_view(self) -> LeaseView:
        """Every lease row and live replica now (for status and tests)."""

        def work(session: Session) -> LeaseView:
            return self._view(session, self._store.db_now(session), None)

        return await self._store._run(work, write=False)

    async def phases_for(self, epochs: Mapping[str, str]) -> dict[str, list[PhaseRecord]]:
        """The restart warm-up phases of each box's given epoch, in one query: how a replica that does not
        hold a box learns whether its holder finished the warm-up."""
        return await self._store.phases_of(epochs)

    # -- shared deploy state ------------------------------------------------------------------------

    async def shared_state(self) -> SharedFleetState:
        def work(session: Session) -> SharedFleetState:
            rollouts = {
                row.box_id: RolloutMark(
                    box_id=row.box_id,
                    drain_reason=row.drain_reason,
                    epoch_tag=row.epoch_tag,
                    event_id=row.event_id,
                    at=row.updated_at,
                )
                for row in session.scalars(select(RolloutStateRow))
            }
            changes: dict[str, FleetChange] = {}
            for change_row in session.scalars(select(FleetChangeRow)):
                try:
                    added = None if change_row.added is None else box_from_data(change_row.added)
                except (ValueError, TypeError) as exc:
                    raise StoreError(f"fleet_changes[{change_row.box_id!r}].added: {exc}") from exc
                changes[change_row.box_id] = FleetChange(
                    box_id=change_row.box_id, added=added, event_id=change_row.event_id, at=change_row.at
                )
            return SharedFleetState(rollouts=rollouts, changes=changes)

        return await self._store._run(work, write=False)

    async def apply_deploy(
        self, event_id: str, kind: str, body_sha256: str, at: float, change: StateChange
    ) -> bool:
        """Remember the event id and write what it changes, both or neither; False (nothing written) when
        the id was already received, by this replica or another."""
        if not event_id:
            raise StoreError("event_id: must not be empty")

        def work(session: Session) -> bool:
            new = self._store._insert_if_absent(
                session,
                WebhookEventRow,
                {"event_id": event_id, "kind": kind, "body_sha256": body_sha256, "received_at": at},
                keys=["event_id"],
            )
            if not new:
                return False
            for box_id, reason in change.drain.items():
                self._mark(session, box_id, event_id, at, drain_reason=reason)
            for box_id, tag in change.undrain.items():
                self._mark(session, box_id, event_id, at, drain_reason=None, epoch_tag=tag)
            if change.add is not None:
                self._store._upsert(
                    session,
                    FleetChangeRow,
                    {
                        "box_id": change.add.id,
                        "added": box_to_data(change.add),
                        "event_id": event_id,
                        "at": at,
                    },
                    keys=["box_id"],
                )
                session.execute(delete(RolloutStateRow).where(RolloutStateRow.box_id == change.add.id))
            if change.remove is not None:
                self._store._upsert(
                    session,
                    FleetChangeRow,
                    {"box_id": change.remove, "added": None, "event_id": event_id, "at": at},
                    keys=["box_id"],
                )
                session.execute(delete(RolloutStateRow).where(RolloutStateRow.box_id == change.remove))
            self._notify(session, "fleet")
            return True

        try:
            return await self._store._run(work, write=True)
        except StoreError as exc:
            if isinstance(exc.__cause__, IntegrityError):  # a concurrent delivery of the same id won
                return False
            raise

    # -- plumbing -----------------------------------------------------------------------------------

    def _mark(
        self,
        session: Session,
        box_id: str,
        event_id: str,
        at: float,
        *,
        drain_reason: str | None,
        epoch_tag: str | None = None,
    ) -> None:
        """Upsert a box's rollout row; a drain keeps the box's epoch tag (its process still runs the tagged
        epoch until the rollout restarts it)."""
        values: dict[str, Any] = {
            "box_id": box_id,
            "drain_reason": drain_reason,
            "epoch_tag": epoch_tag,
            "event_id": event_id,
            "updated_at": at,
        }
        columns = ["drain_reason", "event_id", "updated_at"] + ([] if epoch_tag is None else ["epoch_tag"])
        self._store._upsert(session, RolloutStateRow, values, keys=["box_id"], update=columns)

    def _notify(self, session: Session, what: str) -> None:
        if self._store.dialect == "postgresql":
            session.execute(
                text("SELECT pg_notify(:channel, :what)"), {"channel": CHANGES_CHANNEL, "what": what}
            )

    @staticmethod
    def _view(session: Session, now: float, fleet: Sequence[str] | None) -> LeaseView:
        query = select(BoxLeaseRow).execution_options(populate_existing=True)  # after this txn's UPDATEs
        if fleet is not None:
            query = query.where(BoxLeaseRow.box_id.in_(fleet))
        leases = {
            row.box_id: Lease(
                box_id=row.box_id, owner=row.owner, acquired_at=row.acquired_at, expires_at=row.expires_at
            )
            for row in session.scalars(query)
        }
        live = frozenset(session.scalars(select(ReplicaRow.id).where(ReplicaRow.expires_at > now)))
        return LeaseView(now=now, leases=leases, live_replicas=live)
