"""The reconciler's reactions to KV cache events (`warmer.service.reconciler.evictions`), over a fake
record book and the real watcher fed by the fake event port (tests/unit/kv_cache_fakes.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from tests.unit.kv_cache_fakes import FakeCache, FakePort, FakePublisher, TickClock
from warmer.core.model import BoxSpec, EngineKind, KvEventsEndpoint, Prefix, WarmRecord, WarmState
from warmer.core.planner import WarmKey
from warmer.core.residency import PrefixState
from warmer.core.warmstate import RetryBackoff
from warmer.service.engine_signals.cache_events import CacheEventWatcher, ResetReason
from warmer.service.reconciler.evictions import EvictionReactions

pytestmark = pytest.mark.timeout(30)

BOX = BoxSpec("v1", "http://127.0.0.1:1", EngineKind.VLLM, "tiny", kv_events=KvEventsEndpoint("tcp://h:1"))
PROMPT = tuple(range(100, 110))  # two full blocks of the fake's 4 tokens and a partial one
PREFIX = Prefix(text="p", token_count=10, token_ids=PROMPT)


def record(prefix_hash: str, state: WarmState, *, box: str = "v1", epoch: str = "e1") -> WarmRecord:
    return WarmRecord(
        box_id=box,
        epoch=epoch,
        prefix_hash=prefix_hash,
        state=state,
        prefix_tokens=10,
        verified_cached_tokens=8,
        updated_at=1.0,
        warmed_at=1.0,
        verified_at=1.0,
    )


@dataclass
class FakeBook:
    records: dict[WarmKey, WarmRecord] = field(default_factory=dict)
    writes: list[tuple[WarmRecord, str, WarmState | None]] = field(default_factory=list)
    released: list[WarmKey] = field(default_factory=list)

    def add(self, *records: WarmRecord) -> FakeBook:
        for r in records:
            self.records[(r.box_id, r.epoch, r.prefix_hash)] = r
        return self

    async def write(self, updated: WarmRecord, *, reason: str, previous: WarmState | None) -> None:
        self.writes.append((updated, reason, previous))
        self.records[(updated.box_id, updated.epoch, updated.prefix_hash)] = updated

    def release_pin(self, key: WarmKey) -> None:
        self.released.append(key)


@dataclass
class Rig:
    book: FakeBook
    reactions: EvictionReactions
    rechecked: list[str]
    pokes: list[None]


def make_rig(book: FakeBook) -> Rig:
    rechecked: list[str] = []
    pokes: list[None] = []

    async def recheck(box_id: str) -> None:
        rechecked.append(box_id)

    reactions = EvictionReactions(
        book=book,
        epoch_of={"v1": "e1", "v2": "e9"}.get,
        recheck=recheck,
        poke=lambda: pokes.append(None),
        clock=TickClock(),
        retry=RetryBackoff(),
    )
    return Rig(book, reactions, rechecked, pokes)


async def idle(reactions: EvictionReactions) -> None:
    await reactions.wait_idle()


def test_an_eviction_makes_a_warm_record_evicted_at_once_so_the_next_pass_rewarms_it() -> None:
    book = FakeBook().add(record("a", WarmState.WARM), record("b", WarmState.STALE))
    rig = make_rig(book)

    async def go() -> None:
        rig.reactions.prefix_evicted("v1", "a", 4)
        rig.reactions.prefix_evicted("v1", "b", 0)
        await idle(rig.reactions)

    asyncio.run(go())

    assert [(r.prefix_hash, r.state, r.verified_cached_tokens, prev) for r, _, prev in book.writes] == [
        ("a", WarmState.EVICTED, 4, WarmState.WARM),
        ("b", WarmState.EVICTED, 0, WarmState.STALE),
    ]
    assert "kv event: evicted" in book.writes[0][1]
    assert book.released == [("v1", "e1", "a"), ("v1", "e1", "b")]
    assert len(rig.pokes) == 2


@pytest.mark.parametrize(
    "held",
    [
        record("a", WarmState.WARMING),  # its own warm is in flight and will verify it
        record("a", WarmState.COLD),
        record("a", WarmState.WARM, epoch="e0"),  # an older process's record
        record("a", WarmState.WARM, box="v2"),
    ],
)
def test_an_eviction_of_a_prefix_not_believed_warm_here_changes_nothing(held: WarmRecord) -> None:
    rig = make_rig(FakeBook().add(held))

    async def go() -> None:
        rig.reactions.prefix_evicted("v1", "a", 0)
        rig.reactions.prefix_evicted("v3", "a", 0)  # a box with no epoch known
        await idle(rig.reactions)

    asyncio.run(go())
    assert rig.book.writes == []
    assert rig.pokes == []


def test_a_restart_looks_at_the_box_now() -> None:
    rig = make_rig(FakeBook())

    async def go() -> None:
        rig.reactions.box_reset("v1", ResetReason.RESTARTED)
        await idle(rig.reactions)

    asyncio.run(go())
    assert rig.rechecked == ["v1"]


def test_lost_events_make_every_warm_prefix_of_the_box_due_for_a_touch() -> None:
    book = FakeBook().add(
        record("a", WarmState.WARM),
        record("b", WarmState.STALE),
        record("c", WarmState.EVICTED),
        record("d", WarmState.WARM, box="v2", epoch="e9"),
    )
    rig = make_rig(book)

    async def go() -> None:
        rig.reactions.box_reset("v1", ResetReason.LOST)
        await idle(rig.reactions)

    asyncio.run(go())
    assert [(r.prefix_hash, r.state) for r, _, _ in book.writes] == [("a", WarmState.STALE)]
    assert len(rig.pokes) == 1
    assert rig.rechecked == []


def test_a_verified_prefix_is_followed_and_the_horizon_is_measured_from_other_blocks() -> None:
    """Residency never replaces a keepalive touch (the action runner has no such path any more); what the
    events give the planner is how long other prefixes' unused blocks last before eviction."""

    async def go() -> tuple[object, object, dict[str, float], dict[str, float], Rig]:
        publisher, cache = FakePublisher(), FakeCache()
        rig = make_rig(FakeBook().add(record(PREFIX.hash, WarmState.WARM)))
        watcher = CacheEventWatcher(
            port=FakePort(publisher),
            listener=rig.reactions,
            fleet=lambda: [BOX],
            tokenize=lambda box, text: asyncio.sleep(0, result=[]),
            clock=TickClock(),
        )
        rig.reactions.attach(watcher)
        before = rig.reactions.still_resident("v1", PREFIX.hash)
        watcher.sync_boxes([BOX])
        await asyncio.sleep(0)
        await publisher.settled()
        publisher.publish(cache.store(PROMPT))  # batch ts 0
        await publisher.settled()
        rig.reactions.verified(BOX, PREFIX)
        await idle(rig.reactions)
        resident = rig.reactions.still_resident("v1", PREFIX.hash)
        unmeasured = rig.reactions.horizons()
        others = [tuple(range(1000 + 8 * i, 1008 + 8 * i)) for i in range(8)]
        for other in others:
            publisher.publish(cache.store(other))
        for other in others:  # each other block evicted 8 batches after it was stored
            publisher.publish(cache.evict(other, 0))
        await publisher.settled()
        measured = rig.reactions.horizons()
        await watcher.close()
        return before, resident, unmeasured, measured, rig

    before, resident, unmeasured, measured, rig = asyncio.run(go())
    assert before is None
    assert getattr(resident, "state", None) is PrefixState.RESIDENT
    assert unmeasured == {}
    assert measured == {"v1": 8.0}
    assert rig.book.writes == []  # resident: nothing to write, and no renewal in place of a touch
    assert rig.pokes == []


def test_without_a_watcher_nothing_is_followed_or_vouched_for() -> None:
    rig = make_rig(FakeBook())

    async def go() -> None:
        rig.reactions.verified(BOX, PREFIX)
        rig.reactions.prefix_resident("v1", PREFIX.hash)
        await idle(rig.reactions)

    asyncio.run(go())
    assert rig.reactions.still_resident("v1", PREFIX.hash) is None
    assert rig.book.writes == []
