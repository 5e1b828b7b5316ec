"""The health poll's queued store writes go out one kind at a time for the whole fleet, in one call each,
and never out of order for one box: a box's epoch writes keep their queue order (a sighting of the old
process before the new one, a box's two restarts in two calls)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

import structlog

from warmer.core.event_kinds import EventKind
from warmer.core.model import LoggedEvent, PhaseRecord
from warmer.ports import StorePort
from warmer.service.reconciler.epoch_writes import EpochSeen, EventLater, NewEpoch, Unwritten, write_batch


class RecordingStore:
    """Records the batched calls `write_batch` makes; `fenced` boxes are refused as the lease fence does."""

    def __init__(self, fenced: frozenset[str] = frozenset()) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fenced = fenced

    async def record_epochs(
        self, seen: Sequence[tuple[str, str, float]], *, drop_others: bool = False
    ) -> frozenset[str]:
        self.calls.append(("new" if drop_others else "seen", [(b, e) for b, e, _ in seen]))
        return frozenset(b for b, _, _ in seen if b in self.fenced)

    async def put_phases_and_events(
        self, phases: Sequence[PhaseRecord], events: Sequence[LoggedEvent]
    ) -> frozenset[str]:
        self.calls.append(("events", [(e.box_id, e.kind) for e in events]))
        return frozenset()


def queue(store: StorePort) -> Unwritten:
    down = LoggedEvent(at=1.0, kind=EventKind.BOX_UNHEALTHY, box_id="a", epoch="e1")
    writes: list[tuple[tuple[object, ...], Any]] = [
        (("a", "epoch", "e1"), EpochSeen(store, "a", "e1", 1.0)),
        (("a", "event", down.kind, 1.0), EventLater(store, down)),
        (("a", "epoch", "e2"), NewEpoch(store, "a", "e2", 2.0)),
        (("b", "epoch", "b1"), EpochSeen(store, "b", "b1", 2.0)),
        (("c", "epoch", "c1"), NewEpoch(store, "c", "c1", 2.0)),
        (("c", "epoch", "c2"), NewEpoch(store, "c", "c2", 3.0)),
        (("c", "epoch", "c2", "seen"), EpochSeen(store, "c", "c2", 3.0)),
    ]
    return dict(writes)


def drain(store: RecordingStore) -> list[tuple[str, Any]]:
    unwritten = queue(cast(StorePort, store))
    log = structlog.stdlib.get_logger("test")

    async def run() -> None:
        while unwritten:
            await write_batch(unwritten, cast(StorePort, store), log)

    asyncio.run(run())
    return store.calls


def test_each_kind_goes_in_one_call_and_each_box_keeps_its_order() -> None:
    assert drain(RecordingStore()) == [
        ("seen", [("a", "e1"), ("b", "b1")]),  # c's sighting waits for its new epochs
        ("events", [("a", EventKind.BOX_UNHEALTHY)]),
        ("new", [("a", "e2"), ("c", "c1")]),  # c's second restart waits for its first
        ("new", [("c", "c2")]),
        ("seen", [("c", "c2")]),
    ]


def test_a_box_held_elsewhere_is_dropped_from_the_queue() -> None:
    calls = drain(RecordingStore(fenced=frozenset({"c"})))
    # c's writes are refused (another replica holds it) and leave the queue all the same
    assert [kind for kind, _ in calls] == ["seen", "events", "new", "new", "seen"]
