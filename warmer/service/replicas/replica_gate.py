"""What the reconciler asks when it runs as one of several replicas on one database.

- `owns(box)`: only the holder of a box's lease sends it warm, restart warm-up and probe work, polls its
  health and epoch, and writes its rows (epochs, warm records, phases, its ready moment, its health
  observation). With `health` (several replicas on PostgreSQL), the others read the holder's
  observations (`read_observations`) and count the box not ready once the newest is older than
  `stale_after_seconds`; a box without a live holder is polled by every replica until one takes it
  (`warmer.service.reconciler.health_sharing`). Without it, every replica polls every box.
- `trusted_after(box, started_at)`: a warm record counts for routing only when verified by the box's
  current holder while holding it (and, for the holder itself, not before its own start).
- `stored_warmups(epochs)`: for boxes held elsewhere, how far the holder's restart warm-up got.
- `shared_state()` and `fleet_edits(...)`: rollout drains, epoch tags and webhook fleet changes every replica
  applies each pass (`warmer.core.shared_state`).
On its own SQLite file a daemon holds every box trivially (`SoleOwnership`); a reconciler without a gate
(over a fake store in unit tests) owns every box and shares nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from warmer.core.model import BoxSpec
from warmer.core.observations import DEFAULT_STALE_AFTER_SECONDS, HealthObservation, StoredObservation
from warmer.core.shared_state import SharedFleetState
from warmer.ports import CoordinationPort, HealthExchangePort
from warmer.service.replicas.ownership import LeaseHolder
from warmer.service.replicas.shared_view import StoredWarmup, warmup_from_phases


@dataclass(frozen=True, slots=True)
class FleetEdits:
    """Boxes to bring in (new, or changed spec) and to take out, to make the running fleet the shared one."""

    add: tuple[BoxSpec, ...] = ()
    remove: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.add or self.remove)


class ReplicaGate:
    """This replica's leases and the shared state, as the reconciler consults them."""

    def __init__(
        self,
        *,
        ownership: LeaseHolder,
        coordination: CoordinationPort,
        health: HealthExchangePort | None = None,
        stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS,
    ) -> None:
        if stale_after_seconds <= 0:
            raise ValueError("stale_after_seconds must be > 0")
        self.ownership = ownership
        self._coordination = coordination
        self._health = health  # None: every replica polls every box itself (one daemon alone)
        self._stale_after = stale_after_seconds
        self._applied: dict[str, str] = {}  # box id -> event id of the fleet change applied last

    @property
    def replica_id(self) -> str:
        return self.ownership.replica_id

    def owns(self, box_id: str) -> bool:
        return self.ownership.owns(box_id)

    def owner_of(self, box_id: str) -> str | None:
        return self.ownership.owner_of(box_id)

    def trusted_after(self, box_id: str, started_at: float) -> float:
        return self.ownership.trusted_after(box_id, started_at)

    @property
    def shares_health(self) -> bool:
        """Whether box health is polled by lease holders only and shared through the store."""
        return self._health is not None

    @property
    def stale_after_seconds(self) -> float:
        """A holder's observation older than this (database clock) leaves the box not ready elsewhere."""
        return self._stale_after

    async def read_observations(self, box_ids: Collection[str]) -> dict[str, StoredObservation]:
        return {} if self._health is None else await self._health.read(box_ids)

    async def publish_observations(
        self, changed: Mapping[str, HealthObservation], *, stamp: bool
    ) -> frozenset[str]:
        if self._health is None:
            return frozenset()
        return await self._health.publish(self.replica_id, changed, stamp=stamp)

    async def shared_state(self) -> SharedFleetState:
        return await self._coordination.shared_state()

    def fleet_edits(self, running: Mapping[str, BoxSpec], state: SharedFleetState) -> FleetEdits:
        """The stored fleet changes not applied here yet, as edits of the running fleet (a box this
        replica already runs as the change says is left alone). Boxes no change names (configured ones,
        ones discovery found) are never touched."""
        add: list[BoxSpec] = []
        remove: list[str] = []
        for box_id, change in sorted(state.changes.items()):
            if self._applied.get(box_id) == change.event_id:
                continue
            self._applied[box_id] = change.event_id
            current = running.get(box_id)
            if change.added is None:
                if current is not None:
                    remove.append(box_id)
            elif current != change.added:
                if current is not None:
                    remove.append(box_id)  # a changed spec: out, then in again
                add.append(change.added)
        return FleetEdits(add=tuple(add), remove=tuple(remove))

    async def stored_warmups(self, epochs: Mapping[str, str]) -> dict[str, StoredWarmup]:
        """box id -> its restart warm-up in the given epoch, as the holder's phases say."""
        phases = await self._coordination.phases_for(epochs)
        return {box_id: warmup_from_phases(found) for box_id, found in phases.items()}
