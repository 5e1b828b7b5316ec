"""What the reconciler asks when it runs as one of several replicas on one database.

- `owns(box)`: only the holder of a box's lease sends it warm, restart warm-up and probe work and writes
  its rows (epochs, warm records, phases, its ready moment). Every replica still polls every box, so a
  restarted engine leaves readiness on all of them at once.
- `trusted_after(box, started_at)`: a warm record counts for routing only when verified by the box's
  current holder while holding it (and, for the holder itself, not before its own start).
- `stored_warmups(epochs)`: for boxes held elsewhere, how far the holder's restart warm-up got.
- `shared_state()` and `fleet_edits(...)`: rollout drains, epoch tags and webhook fleet changes every replica
  applies each pass (`warmer.core.shared_state`).
On its own SQLite file a daemon holds every box trivially (`SoleOwnership`); a reconciler without a gate
(over a fake store in unit tests) owns every box and shares nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from warmer.core.model import BoxSpec
from warmer.core.shared_state import SharedFleetState
from warmer.ports import CoordinationPort
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

    def __init__(self, *, ownership: LeaseHolder, coordination: CoordinationPort) -> None:
        self.ownership = ownership
        self._coordination = coordination
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
