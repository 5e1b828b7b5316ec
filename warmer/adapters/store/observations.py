"""`SqlHealthExchange`: box health observations written by lease holders and read by the other replicas
(the HealthExchangePort; the rules are `warmer.core.observations`).

A poll round costs the holder one transaction: the changed boxes' rows (only boxes whose lease it holds by
the database's clock: a replica past its lease writes nothing over its successor) and one stamp on its own
replica row. A reader's round is one SELECT that ages every observation by the database's clock and says
whether its observer still holds the box, so no replica compares its own clock with another's.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from sqlalchemy import select, text, update
from sqlalchemy.orm import Session

from warmer.adapters.store.coordination import CHANGES_CHANNEL
from warmer.adapters.store.store import SqlStore
from warmer.adapters.store.tables import BoxLeaseRow, BoxObservationRow, ReplicaRow
from warmer.core.errors import StoreError
from warmer.core.observations import HealthObservation, StoredObservation


class SqlHealthExchange:
    """Observations over the tables and connections of `store`."""

    def __init__(self, store: SqlStore) -> None:
        self._store = store

    async def publish(
        self, replica_id: str, changed: Mapping[str, HealthObservation], *, stamp: bool
    ) -> frozenset[str]:
        """Write the changed observations of boxes `replica_id` holds, and with `stamp` mark its poll round,
        in one transaction; a change wakes the other replicas (PostgreSQL NOTIFY). Returns the boxes
        written (a box whose lease is not held is skipped)."""
        if not replica_id:
            raise StoreError("replica_id: must not be empty")

        def work(session: Session) -> frozenset[str]:
            now = self._store.db_now(session)
            held: frozenset[str] = frozenset()
            if changed:
                held = frozenset(
                    session.scalars(
                        select(BoxLeaseRow.box_id).where(
                            BoxLeaseRow.box_id.in_(list(changed)),
                            BoxLeaseRow.owner == replica_id,
                            BoxLeaseRow.expires_at > now,
                        )
                    )
                )
            for box_id in sorted(held):
                seen = changed[box_id]
                self._store._upsert(
                    session,
                    BoxObservationRow,
                    {
                        "box_id": box_id,
                        "observer": replica_id,
                        "healthy": seen.healthy,
                        "epoch": seen.epoch,
                        "failure": seen.failure,
                        "error": seen.error,
                        "changed_at": now,
                    },
                    keys=["box_id"],
                )
            if stamp:
                session.execute(update(ReplicaRow).where(ReplicaRow.id == replica_id).values(polled_at=now))
            if held and self._store.dialect == "postgresql":
                session.execute(
                    text("SELECT pg_notify(:channel, :what)"), {"channel": CHANGES_CHANNEL, "what": "health"}
                )
            return held

        return await self._store._run(work, write=True)

    async def read(self, box_ids: Collection[str]) -> dict[str, StoredObservation]:
        """The stored observation of each of `box_ids` that has one, aged and checked against its lease."""
        wanted = sorted(set(box_ids))
        if not wanted:
            return {}

        def work(session: Session) -> dict[str, StoredObservation]:
            now = self._store.db_now(session)
            rows = session.execute(
                select(BoxObservationRow, ReplicaRow.polled_at, BoxLeaseRow.owner, BoxLeaseRow.expires_at)
                .outerjoin(ReplicaRow, ReplicaRow.id == BoxObservationRow.observer)
                .outerjoin(BoxLeaseRow, BoxLeaseRow.box_id == BoxObservationRow.box_id)
                .where(BoxObservationRow.box_id.in_(wanted))
            )
            found: dict[str, StoredObservation] = {}
            for row, polled_at, owner, expires_at in rows:
                found[row.box_id] = StoredObservation(
                    box_id=row.box_id,
                    observation=HealthObservation(
                        healthy=row.healthy, epoch=row.epoch, failure=row.failure, error=row.error
                    ),
                    observer=row.observer,
                    age_seconds=None if polled_at is None else max(0.0, now - polled_at),
                    held_by_observer=owner == row.observer and expires_at is not None and expires_at > now,
                )
            return found

        return await self._store._run(work, write=False)
