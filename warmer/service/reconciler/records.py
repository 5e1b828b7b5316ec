"""The reconciler's view of warm state: the current epochs' warm records and the slots they are pinned to.

Between two reloads this view is *newer* than the store, not a copy of it. Every pass reloads it from the
store (another replica or an operator may have written rows); in between, this daemon patches it with
each transition it makes, written to the store first (so the store holds every transition, the history
the next daemon and other replicas read), and drops a restarted box's records at once, before the store
hears of the new epoch (that write may be queued behind a database outage: `restart_detection`). A
reload keeps this daemon's record when it is newer than the row read back.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from warmer.core.model import BoxCapacity, WarmRecord, WarmState
from warmer.core.planner import WarmKey
from warmer.core.warmstate import is_serving
from warmer.ports import StorePort

# A prefix verified this recently is believed where it is even in a contested slot (`WarmBook.at_risk`):
# the call answered now sends its first turn within this, before another call's next turn can land.
VERIFIED_FRESH_SECONDS = 1.0
# A side request reaches the slot lent to it within this long of the lend (the probe that follows it into
# the slot waits as long): a warm put there meanwhile is overwritten before it is verified or used.
SIDE_REQUEST_START_SECONDS = 2.0


class WarmBook:
    """Warm records by (box, epoch, prefix), and the engine slot each pinned prefix holds."""

    def __init__(self, store: StorePort) -> None:
        self._store = store
        self.records: dict[WarmKey, WarmRecord] = {}
        # (box, epoch, prefix) -> the engine slot holding it, on engines with pinnable slots (llama.cpp):
        # a warm reserves a slot no other kept prefix of the box holds, and every later request of
        # warmer's for that prefix (keepalive, probe) and every pinned call runs there
        self.pins: dict[WarmKey, int] = {}
        # (box, epoch, slot) -> prefix -> when a pre-call answer last sent a call there. A call keeps sending
        # its turns to its slot until it ends, so another prefix put in that slot meanwhile is overwritten by
        # them and cannot be vouched for on its record alone (`at_risk`)
        self.slot_calls: dict[tuple[str, str, int], dict[str, float]] = {}
        # (box, epoch, slot) -> when the slot was last lent to a side request (no agent's call: a summary, a
        # classifier; `side_requests`). It overwrote whatever prefix the slot held, so that prefix is vouched
        # for again only once verified after it (`at_risk`)
        self.side_uses: dict[tuple[str, str, int], float] = {}
        # Verifications older than this (the daemon's start) are re-probed before they count as warm.
        self.trusted_after = 0.0
        # ... per box, with several replicas (`replicas.ReplicaSync.trusted_since`); None: the above
        self.trusted_since: Callable[[str], float] | None = None

    def get(self, key: WarmKey) -> WarmRecord | None:
        return self.records.get(key)

    async def reload(self, current: Mapping[str, str], in_flight: Collection[tuple[str, str]]) -> None:
        """Re-read the current epochs' rows (`current`: box id -> epoch). A warm or probe of this daemon
        may have finished while the rows were being read: its newer transition (already written) wins over
        the older row the read returned, so a just-verified prefix is not probed or warmed again on stale
        evidence; so does a record of work still in flight (`in_flight`: (box, prefix)) with no row yet."""
        rows = await self._store.list_warm()
        loaded = {(r.box_id, r.epoch, r.prefix_hash): r for r in rows if current.get(r.box_id) == r.epoch}
        for key, mine in self.records.items():
            row = loaded.get(key)
            if (row is None and (key[0], key[2]) in in_flight) or (
                row is not None and mine.updated_at > row.updated_at
            ):
                loaded[key] = mine
        self.records = loaded

    async def write(self, updated: WarmRecord, *, reason: str, previous: WarmState | None) -> None:
        """One transition: into the store with its reason, then into this view."""
        await self._store.put_warm(updated, reason=reason, previous=previous)
        self.records[(updated.box_id, updated.epoch, updated.prefix_hash)] = updated

    def trusted(self) -> dict[WarmKey, WarmRecord]:
        """Records that count as warm for routing: a verification from before this daemon started does
        not, until a probe renews it."""
        return {key: record for key, record in self.records.items() if self.is_trusted(record)}

    def is_trusted(self, record: WarmRecord) -> bool:
        """Whether `trusted()` keeps the record."""
        return record.state not in (WarmState.WARM, WarmState.STALE) or (
            record.verified_at is not None and record.verified_at >= self.threshold(record.box_id)
        )

    def threshold(self, box_id: str) -> float:
        """Verifications of the box older than this do not count as warm until re-probed."""
        return self.trusted_after if self.trusted_since is None else self.trusted_since(box_id)

    def keep_only_epochs(self, epochs: Mapping[str, str]) -> None:
        """New processes hold nothing of the old ones': each box's (box id -> its new epoch) records and
        pins of other epochs go, in one pass over the book however many boxes restarted."""

        def kept(key: tuple[str, str, object]) -> bool:
            epoch = epochs.get(key[0])
            return epoch is None or key[1] == epoch

        self.records = {k: r for k, r in self.records.items() if kept(k)}
        self.pins = {k: s for k, s in self.pins.items() if kept(k)}
        self.slot_calls = {k: c for k, c in self.slot_calls.items() if kept(k)}
        self.side_uses = {k: t for k, t in self.side_uses.items() if kept(k)}

    def forget_box(self, box_id: str) -> None:
        self.records = {k: r for k, r in self.records.items() if k[0] != box_id}
        self.pins = {k: s for k, s in self.pins.items() if k[0] != box_id}
        self.slot_calls = {k: c for k, c in self.slot_calls.items() if k[0] != box_id}
        self.side_uses = {k: t for k, t in self.side_uses.items() if k[0] != box_id}

    def note_call(self, key: WarmKey, slot: int, now: float, hold: float) -> None:
        """A pre-call answer sent a call for `key`'s prefix to `slot`; calls over `hold` ago are forgotten."""
        calls = self.slot_calls.setdefault((key[0], key[1], slot), {})
        calls[key[2]] = now
        for prefix_hash in [p for p, at in calls.items() if at <= now - hold]:
            del calls[prefix_hash]

    def at_risk(self, key: WarmKey, now: float, hold: float) -> bool:
        """The prefix's slot was lent to a side request since the prefix was last verified, or given to a
        call of another prefix within `hold` (that call may still be sending turns there, each overwriting
        the slot) and the prefix was not verified since just now: believe it there only after a probe."""
        slot = self.pins.get(key)
        if slot is None:
            return False
        record = self.records.get(key)
        verified = record.verified_at if record is not None else None
        lent = self.side_uses.get((key[0], key[1], slot))
        if lent is not None and (verified is None or verified <= lent):
            return True  # a side request was sent there since the prefix was last seen in the slot
        calls = self.slot_calls.get((key[0], key[1], slot))
        if not calls or not any(p != key[2] and at > now - hold for p, at in calls.items()):
            return False
        return verified is None or verified < now - VERIFIED_FRESH_SECONDS

    def note_side_use(self, box_id: str, epoch: str, slot: int, now: float) -> None:
        """The slot was lent to a side request now (`at_risk` holds its prefix until verified again)."""
        self.side_uses[(box_id, epoch, slot)] = now

    def slot_in_call(self, box_id: str, epoch: str, slot: int, now: float, hold: float) -> bool:
        """A pre-call answer sent a call to the slot within `hold`: its turns may still be running there."""
        calls = self.slot_calls.get((box_id, epoch, slot), {})
        return any(at > now - hold for at in calls.values())

    def pin_for(
        self,
        key: WarmKey,
        capacity: BoxCapacity | None,
        *,
        now: float | None = None,
        hold: float = 0.0,
        avoid: Collection[int] = (),
    ) -> int | None:
        """The slot for a warm of `key`: the one it holds, else a slot no other kept prefix of the box holds
        (reserved now, so two warms in flight never pick the same), else none (the engine chooses). Of the
        free slots, one whose content nothing else is about to replace first: `avoid` (a slot just seen
        overwritten) last; before it, given `now`, a slot lent to a side request still on its way there
        (`SIDE_REQUEST_START_SECONDS`: it is certain to land); and before that a slot sent another prefix's
        call or lent to a side request within `hold` (`used_lately`)."""
        if key in self.pins:
            return self.pins[key]
        if capacity is None or not capacity.pinnable_slots:
            return None
        taken = {slot for (b, e, _), slot in self.pins.items() if b == key[0] and e == key[1]}
        free = [slot for slot in range(capacity.pinnable_slots) if slot not in taken]
        if not free:
            return None
        chosen = min(
            free,
            key=lambda slot: (
                slot in avoid,
                now is not None and self.side_on_its_way(key, slot, now),
                now is not None and self.used_lately(key, slot, now, hold),
                slot,
            ),
        )
        self.pins[key] = chosen
        return chosen

    def side_on_its_way(self, key: WarmKey, slot: int, now: float) -> bool:
        """The slot was lent to a side request so lately that the request may not have reached it yet."""
        lent = self.side_uses.get((key[0], key[1], slot))
        return lent is not None and lent > now - SIDE_REQUEST_START_SECONDS

    def used_lately(self, key: WarmKey, slot: int, now: float, hold: float) -> bool:
        """Within `hold`, a pre-call answer sent a call of another prefix than `key`'s to the slot (its turns
        may still land there), or the slot was lent to a side request: a warm put there may be overwritten
        before it is verified or used."""
        box_id, epoch, prefix_hash = key
        calls = self.slot_calls.get((box_id, epoch, slot), {})
        if any(p != prefix_hash and at > now - hold for p, at in calls.items()):
            return True
        lent = self.side_uses.get((box_id, epoch, slot))
        return lent is not None and lent > now - hold

    def slot(self, key: WarmKey) -> int | None:
        return self.pins.get(key)

    def serving_slot(self, key: WarmKey) -> int | None:
        """The slot a call for `key` may name: only while the prefix is believed warm there."""
        record = self.records.get(key)
        if record is None or not is_serving(record):
            return None
        return self.pins.get(key)

    def keep_pin(self, key: WarmKey, slot: int) -> None:
        self.pins[key] = slot

    def release_pin(self, key: WarmKey) -> None:
        self.pins.pop(key, None)
