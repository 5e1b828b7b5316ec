"""The reconciler as one of several replicas on one database (`warmer.service.replicas.replica_gate`).

- Each pass starts from the shared deploy state: rollout drains and epoch tags, and the webhook fleet
  changes (boxes joining or leaving the running fleet), whichever replica received the event.
- Only the holder of a box's lease sends it engine work (health and epoch polls included) and writes its
  rows; the loop drops the plan's actions for other boxes, `restart_detection` reads the holder's health
  observations for them (`health_sharing`), and `ready_reports` and `precall` ask `owns`.
- For a box held elsewhere, the restart warm-up status comes from the holder's phases in the store, and a
  warm record counts only when the current holder verified it while holding the box (`trusted_since`).
- When this replica loses a lease, the box's engine work is cancelled (the next holder abandons what was
  left `warming`); a box gained gets engine work only once its previous holder's restart warm-up has been
  read back after the gain (`acts_on`): what this replica read while another held the box may predate that
  warm-up (read "not started" while it ran), and acting on it would run the warm-up and its warms again.
Without a gate (one daemon alone) every box is this daemon's and nothing here changes a pass.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

import structlog

from warmer.core.errors import StoreError
from warmer.core.model import BoxSpec, ModelProfile
from warmer.core.planner import WarmupStatus
from warmer.ports import Clock, StorePort
from warmer.service.reconciler.actions import ActionRunner
from warmer.service.reconciler.fleet_edits import FleetEdits, Rollout
from warmer.service.reconciler.records import WarmBook
from warmer.service.reconciler.restart_detection import BoxHealth
from warmer.service.replicas.replica_gate import ReplicaGate


class ReplicaSync:
    """This replica's share of the boxes, and the shared state applied to the running fleet."""

    def __init__(
        self,
        *,
        gate: ReplicaGate | None,
        store: StorePort,
        clock: Clock,
        boxes: Mapping[str, BoxSpec],
        profiles: Mapping[str, ModelProfile],
        rollout: Rollout,
        health: BoxHealth,
        book: WarmBook,
        runner: ActionRunner,
        fleet: FleetEdits,
        on_fleet_change: Callable[[Sequence[BoxSpec]], None] | None,
        notify_changed: Callable[[], None],
        poke: Callable[[], None],
        log: structlog.stdlib.BoundLogger,
    ) -> None:
        self._gate = gate
        self._store = store
        self._boxes = boxes
        self._profiles = profiles
        self._rollout = rollout
        self._health = health
        self._book = book
        self._runner = runner
        self._fleet = fleet
        self._on_fleet_change = on_fleet_change
        self._notify_changed = notify_changed
        self._poke = poke
        self._log = log
        self._cancelling: set[asyncio.Future[None]] = set()
        # boxes gained whose previous holder's restart warm-up has not been read since the gain
        self._unread_gains: set[str] = set()
        self._clock = clock
        self._lost: set[str] = set()  # boxes whose lease this replica lost (its work there cancelled)
        # box -> when this replica got it back after losing it: its own cancelled warms left `warming`
        # rows that no task here will finish, and with the holding continuous (acquired_at kept) the
        # planner would wait `warming_timeout_seconds` before abandoning them; trusted from then on only
        self._regained_at: dict[str, float] = {}

    def owns(self, box_id: str) -> bool:
        return self._gate is None or self._gate.owns(box_id)

    def acts_on(self, box_id: str) -> bool:
        """Whether a pass may send the box engine work: this replica holds its lease and has read the box's
        restart warm-up from the store since it gained it (`refresh_foreign`)."""
        return self.owns(box_id) and box_id not in self._unread_gains

    @property
    def replica_id(self) -> str | None:
        """This replica's id; None when it runs alone (every box is its own)."""
        return None if self._gate is None else self._gate.replica_id

    def holders(self) -> dict[str, str]:
        """Box -> the replica holding its lease, as this replica last read the leases."""
        if self._gate is None:
            return {}
        owners = {box_id: self._gate.owner_of(box_id) for box_id in self._health.live}
        return {box_id: owner for box_id, owner in owners.items() if owner is not None}

    def busy(self) -> frozenset[str]:
        """Boxes with engine work in flight here (a restart warm-up, a warm or a probe): the lease holder
        keeps them past its fair share until idle, so no successor repeats cut-short work."""
        warming_up = {b for b, live in self._health.live.items() if live.warmup is WarmupStatus.RUNNING}
        return frozenset({box_id for box_id, _ in self._runner.in_flight} | warming_up)

    def trusted_since(self, box_id: str) -> float:
        """Verifications of the box older than this are re-probed and not routed on: this daemon's start,
        and with several replicas the current holder's acquisition of the box."""
        started = self._book.trusted_after
        if self._gate is None:
            return started
        return max(self._gate.trusted_after(box_id, started), self._regained_at.get(box_id, started))

    def trusted_by_box(self) -> dict[str, float]:
        if self._gate is None:
            return {}
        return {box_id: self.trusted_since(box_id) for box_id in self._health.live}

    async def sync_shared(self, *, registered: bool) -> None:
        """Apply the store's drains, epoch tags and fleet changes. A database that does not answer keeps
        what was read last: the pass must still see the engines. `registered`: the fleet is in the store
        already (then a change is written there too)."""
        if self._gate is None:
            return
        try:
            state = await self._gate.shared_state()
        except StoreError as exc:
            self._log.warning("shared deploy state not read", error=str(exc))
            return
        self._rollout.load(state.drains(), state.epoch_tags())
        edits = self._gate.fleet_edits(self._boxes, state)
        if not edits:
            return
        for box_id in edits.remove:
            await self._fleet.leave(box_id)
        for box in edits.add:
            if box.model not in self._profiles:
                self._log.error("shared fleet change names an unknown model", box=box.id, model=box.model)
                continue
            self._fleet.join(box)
        self._log.info(
            "fleet changed by another replica's event",
            added=[b.id for b in edits.add],
            removed=list(edits.remove),
        )
        if self._on_fleet_change is not None:
            self._on_fleet_change(list(self._boxes.values()))
        if registered:
            await self._store.sync_boxes(list(self._boxes.values()))
        self._notify_changed()

    async def refresh_foreign(self) -> None:
        """Boxes held elsewhere, or gained since the last call, and not yet warmed up in their current
        epoch: how far their (previous) holder's restart warm-up got, from its phases in the store. A box
        gained is read once more, so the pass that first works on it starts from what its previous holder
        finished, not from what this replica read before that holder finished."""
        if self._gate is None:
            return
        gained, self._unread_gains = self._unread_gains, set()
        wanted = {
            box_id: live.epoch
            for box_id, live in self._health.live.items()
            if live.epoch is not None
            and (box_id in gained or not self.owns(box_id))
            and live.warmup is not WarmupStatus.DONE
        }
        if not wanted:
            return
        try:
            stored = await self._gate.stored_warmups(wanted)
        except BaseException:
            self._unread_gains |= gained  # still unread: no engine work on them until a read succeeds
            raise
        for box_id, seen in stored.items():
            live = self._health.live.get(box_id)
            if live is None or live.epoch != wanted[box_id]:
                continue
            live.warmup, live.warmup_finished_at, live.warmup_error = (
                seen.status,
                seen.finished_at,
                seen.error,
            )
            if seen.status is WarmupStatus.DONE:
                live.resumed = True
                # the holder finishes the PREFIXES row; a holder taking over one left open finishes it
                live.prefixes_started_at = seen.finished_at if seen.prefixes_open else None

    def leases_changed(self, gained: frozenset[str], lost: frozenset[str]) -> None:
        """The lease holder's report: work on a box held no more is cancelled; a pass follows."""
        self._unread_gains = (self._unread_gains | gained) - lost
        now = self._clock.now()
        self._regained_at.update({box_id: now for box_id in gained & self._lost})
        self._lost = (self._lost | lost) - gained
        for box_id in lost:  # held elsewhere now: its holder's acquisition alone says what to trust
            self._regained_at.pop(box_id, None)
        for box_id in lost:
            live = self._health.live.get(box_id)
            if live is not None and live.warmup is WarmupStatus.RUNNING:
                live.warmup = WarmupStatus.NOT_STARTED  # read back from the holder's phases from now on
            cancelling = asyncio.ensure_future(self._runner.cancel_box(box_id))
            self._cancelling.add(cancelling)
            cancelling.add_done_callback(self._cancelling.discard)
        if gained or lost:
            self._poke()

    async def wait_cancelled(self) -> None:
        """Until the work of boxes lost is cancelled (the loop waits for it when it stops)."""
        while self._cancelling:
            await asyncio.gather(*list(self._cancelling), return_exceptions=True)
