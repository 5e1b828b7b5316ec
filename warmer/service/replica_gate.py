"""What the reconciler asks when it runs as one of several replicas on one database.

- `owns(box)`: only the holder of a box's lease sends it warm, restart warm-up and probe work and writes
  its rows (epochs, warm records, phases, its ready moment). Every replica still polls every box, so a
  restarted engine leaves readiness on all of them at once.
- `trusted_after(box, started_at)`: a warm record counts for routing only when verified by the box's
  current holder while holding it (and, for the holder itself, not before its own start).
- `stored_warmups(epochs)`: for boxes held elsewhere, how far the holder's restart warm-up got.
- `shared_state()` and `fleet_edits(...)`: rollout drains, epoch tags and webhook fleet changes every replica
  applies each pass (`warmer.core.shared_state`).
A reconciler without a gate (one daemon on its own SQLite file, unit tests) owns every box.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from warmer.core.model import BoxSpec
from warmer.core.shared_state import SharedFleetState
from warmer.ports import CoordinationPort
from warmer.service.ownership import LeaseHolder
from warmer.service.shared_view import StoredWarmup, warmup_from_phases


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
        self, *, ownership: LeaseHolder, coordination: CoordinationPort, configured: Sequence[BoxSpec]
    ) -> None:
        self.ownership = ownership
        self._coordination = coordination
        self._configured = tuple(configured)

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
        """How the running fleet differs from the configured one with the shared changes applied."""
        wanted = {box.id: box for box in state.fleet(self._configured)}
        add = tuple(box for box_id, box in wanted.items() if running.get(box_id) != box)
        remove = tuple(
            box_id for box_id, box in running.items() if box_id not in wanted or wanted[box_id] != box
        )
        return FleetEdits(add=add, remove=remove)

    async def stored_warmups(self, epochs: Mapping[str, str]) -> dict[str, StoredWarmup]:
        """box id -> its restart warm-up in the given epoch, as the holder's phases say."""
        phases = await self._coordination.phases_for(epochs)
        return {box_id: warmup_from_phases(found) for box_id, found in phases.items()}
