"""Health-poll store writes, queued per box and written for the whole fleet at once.

Every health poll of a healthy box moves its epoch's last-seen time in the store; a restart writes the new
epoch and drops the old epochs' records; a box going down or up logs an event. Written box by box, a poll
over 1,000 boxes is 1,000 transactions (and, on SQLite, 1,000 turns of its one writer lock while restart
warm-ups write their phases), and a region restart is as many again, one after the other, under the fleet
lock; queued as `EpochSeen`, `NewEpoch` and `EventLater` and flushed by `write_batch`, each kind is one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from warmer.core.model import LoggedEvent
from warmer.ports import StorePort

Unwritten = dict[tuple[object, ...], Callable[[], Awaitable[object]]]


@dataclass(frozen=True, slots=True)
class EpochSeen:
    """A poll saw the box's known epoch again; callable alone too (one write)."""

    store: StorePort
    box_id: str
    epoch: str
    at: float

    async def __call__(self) -> object:
        return await self.store.record_epochs([(self.box_id, self.epoch, self.at)])


@dataclass(frozen=True, slots=True)
class NewEpoch:
    """A poll saw a new process on the box: its epoch becomes current, the old epochs' records go."""

    store: StorePort
    box_id: str
    epoch: str
    at: float

    async def __call__(self) -> object:
        return await self.store.record_epochs([(self.box_id, self.epoch, self.at)], drop_others=True)


@dataclass(frozen=True, slots=True)
class EventLater:
    """An event of the box's health (down, up again) for the log."""

    store: StorePort
    event: LoggedEvent

    async def __call__(self) -> None:
        await self.store.append_event(self.event)


async def write_batch(unwritten: Unwritten, store: StorePort, log: structlog.stdlib.BoundLogger) -> None:
    """Write the queue head's kind for every box that allows it, in one transaction, and take those writes
    off the queue (keys are (box id, what, ...)). Each box keeps its own order of epoch writes: one whose
    box has an earlier epoch write of another kind queued waits for it (a new process is written before it
    is seen again, a sighting of the old one before the new one), and a box's new epochs go one per batch.
    A box another replica holds now is skipped by the store: that replica writes it."""
    _, head = next(iter(unwritten.items()))
    if isinstance(head, EventLater):
        events = {key: write for key, write in unwritten.items() if isinstance(write, EventLater)}
        await store.put_phases_and_events([], [write.event for write in events.values()])
        for key in events:
            del unwritten[key]
        return
    kind = type(head)
    if kind not in (EpochSeen, NewEpoch):
        raise TypeError(f"not a batched write: {head!r}")
    waiting: set[str] = set()  # boxes with an earlier epoch write left out of this batch
    batch: dict[tuple[object, ...], EpochSeen | NewEpoch] = {}
    batched: set[str] = set()
    for key, write in unwritten.items():
        if key[1] != "epoch" or not isinstance(write, EpochSeen | NewEpoch):
            continue
        box_id = write.box_id
        again = kind is NewEpoch and box_id in batched
        if type(write) is kind and box_id not in waiting and not again:
            batch[key] = write
            batched.add(box_id)
        else:
            waiting.add(box_id)
    refused = await store.record_epochs(
        [(w.box_id, w.epoch, w.at) for w in batch.values()], drop_others=kind is NewEpoch
    )
    for box_id in sorted(refused):
        log.warning("box write dropped: lease held elsewhere", box=box_id)
    if kind is NewEpoch:
        log.info("box epochs stored", boxes=len(batch) - len(refused), skipped=len(refused))
    for key in batch:
        del unwritten[key]
