"""Who polls a box's health and epoch when several replicas run: its lease holder, and only it.

The holder polls the boxes it holds and writes what changed, with a stamp for each round that covered
every box it holds (`warmer.core.observations`); every other replica reads those observations instead of
polling. A replica still polls a box itself when no live holder is known (released, expired, or before its
first heartbeat: a takeover never leaves a box unpolled, and the new holder polls it in the pass its gain
wakes), and when it cannot read the store at all (its own polls are then the only current view: a database
outage never costs the fleet its readiness, at the old cost of every replica polling).

A restarted box leaves readiness on every replica within one poll interval (the holder's poll) plus one
store read interval (a reader reads at each of its own polls, `health_poll_seconds`, and at once on the
holder's NOTIFY on PostgreSQL): `restart_bound_seconds`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol

import structlog

from warmer.core.errors import StoreError
from warmer.core.observations import HealthObservation, StoredObservation
from warmer.service.reconciler.types import BoxLive


class HealthSharing(Protocol):
    """What the replica gate offers health polling (`warmer.service.replicas.replica_gate.ReplicaGate`)."""

    @property
    def replica_id(self) -> str: ...

    @property
    def stale_after_seconds(self) -> float: ...

    def owns(self, box_id: str) -> bool: ...

    def owner_of(self, box_id: str) -> str | None: ...

    async def read_observations(self, box_ids: Collection[str]) -> dict[str, StoredObservation]: ...

    async def publish_observations(
        self, changed: Mapping[str, HealthObservation], *, stamp: bool
    ) -> frozenset[str]: ...


def restart_bound_seconds(health_poll_seconds: float) -> float:
    """Longest time (p99, leaving out a poll's own answer time) from a box's restart to its leaving
    readiness on every replica: the holder's next poll, then each reader's next store read."""
    return 2 * health_poll_seconds


def observed(live: BoxLive) -> HealthObservation:
    """What this replica's view says of a box it polls, as the others will read it."""
    if live.healthy:
        return HealthObservation(healthy=True, epoch=live.epoch)
    failure = None if live.health_error_kind is None else str(live.health_error_kind)
    return HealthObservation(healthy=False, epoch=live.epoch, failure=failure, error=live.health_error)


class HolderPolls:
    """This replica's side of the exchange; without `sharing` (one daemon alone) it polls every box."""

    def __init__(self, sharing: HealthSharing | None, log: structlog.stdlib.BoundLogger) -> None:
        self._sharing = sharing
        self._log = log
        self._published: dict[str, HealthObservation] = {}  # box id -> what the store holds from us

    def polled_here(self, box_id: str) -> bool:
        """This replica holds the box, or no live holder is known: it polls the box itself."""
        sharing = self._sharing
        return sharing is None or sharing.owns(box_id) or sharing.owner_of(box_id) is None

    async def read(self, box_ids: Collection[str]) -> dict[str, StoredObservation] | None:
        """The holders' observations of `box_ids`; None when the store did not answer (poll them here)."""
        if self._sharing is None or not box_ids:
            return {}
        try:
            return await self._sharing.read_observations(box_ids)
        except StoreError as exc:
            self._log.warning("holders' health observations not read: polling every box here", error=str(exc))
            return None

    def trusted(self, box_id: str, stored: StoredObservation | None) -> HealthObservation | str:
        """The holder's observation when a reader may act on it, else why not (the box is then not ready)."""
        assert self._sharing is not None  # only boxes another replica polls get here
        bound = self._sharing.stale_after_seconds
        holder = self._sharing.owner_of(box_id)
        if stored is None:
            return f"no health observation stored yet by its holder {holder}"
        if stored.fresh(bound):
            return stored.observation
        if not stored.held_by_observer:
            return f"its observer {stored.observer} holds it no more; holder now: {holder}"
        age = "never" if stored.age_seconds is None else f"{stored.age_seconds:.1f}s ago"
        return f"its holder {stored.observer} last polled it {age} (bound {bound:g}s)"

    async def publish(
        self, live: Mapping[str, BoxLive], polled: Collection[str], *, round_done: bool
    ) -> None:
        """Write what changed of the boxes this replica holds and polled at least once (the others read
        them); `round_done`: every box it holds was polled in this round, so its stamp is renewed."""
        sharing = self._sharing
        if sharing is None:
            return
        held = {box_id for box_id in live if sharing.owns(box_id)}
        self._published = {b: o for b, o in self._published.items() if b in held}  # regained: rewritten
        changed = {
            box_id: seen
            for box_id in held
            if box_id in polled and self._published.get(box_id) != (seen := observed(live[box_id]))
        }
        stamp = round_done and bool(held)
        if not changed and not stamp:
            return
        try:
            written = await sharing.publish_observations(changed, stamp=stamp)
        except StoreError as exc:  # the others see the box stale, then not ready; the next round retries
            self._log.warning("health observations not stored", boxes=len(changed), error=str(exc))
            return
        self._published.update({box_id: changed[box_id] for box_id in written})
