"""A box's known epoch seen again, written for the whole fleet at once.

Every health poll of a healthy box moves its epoch's last-seen time in the store. Written box by box, a pass
over 1,000 boxes is 1,000 transactions (and, on SQLite, 1,000 turns of its one writer lock while restart
warm-ups write their phases); queued as `EpochSeen` and flushed by `write_epochs_seen`, it is one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from warmer.ports import StorePort


@dataclass(frozen=True, slots=True)
class EpochSeen:
    """A poll saw the box's known epoch again; callable alone too (one write)."""

    store: StorePort
    box_id: str
    epoch: str
    at: float

    async def __call__(self) -> object:
        return await self.store.record_epochs([(self.box_id, self.epoch, self.at)])


async def write_epochs_seen(
    unwritten: dict[tuple[object, ...], Callable[[], Awaitable[object]]],
    store: StorePort,
    log: structlog.stdlib.BoundLogger,
) -> None:
    """Write every queued `EpochSeen` in one transaction and take them off the queue (keys are (box id,
    what, ...)). A box with another epoch write queued (a new process) keeps its own order: its sighting
    waits for it. A box another replica holds now is skipped by the store: that replica writes it."""
    others = {key[0] for key, w in unwritten.items() if key[1] == "epoch" and not isinstance(w, EpochSeen)}
    batch = {
        key: write
        for key, write in unwritten.items()
        if isinstance(write, EpochSeen) and write.box_id not in others
    }
    if not batch:  # the head's box has its own epoch write queued: the head goes alone, in order
        key, head = next(iter(unwritten.items()))
        assert isinstance(head, EpochSeen)
        batch = {key: head}
    refused = await store.record_epochs([(w.box_id, w.epoch, w.at) for w in batch.values()])
    for box_id in sorted(refused):
        log.warning("box write dropped: lease held elsewhere", box=box_id)
    for key in batch:
        del unwritten[key]
