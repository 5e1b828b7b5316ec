"""The KV event watcher (`warmer.service.engine_signals.cache_events`) over a fake event port (our seam).

The fakes (`FakePublisher`, `FakePort`, `FakeCache`) are in tests/unit/kv_cache_fakes.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from tests.unit.kv_cache_fakes import FakeCache, FakePort, FakePublisher, FakeStream, TickClock
from warmer.core.errors import EngineUnavailable, MalformedResponse, NotSupported
from warmer.core.kv_event_stream import AllBlocksCleared
from warmer.core.model import BoxSpec, CacheLayout, EngineKind, KvEventsEndpoint, Prefix
from warmer.core.residency import PrefixState
from warmer.service.engine_signals.cache_events import CacheEventsConfig, CacheEventWatcher, ResetReason

pytestmark = pytest.mark.timeout(30)

BOX = BoxSpec("v1", "http://127.0.0.1:1", EngineKind.VLLM, "tiny", kv_events=KvEventsEndpoint("tcp://h:1"))
PLAIN_BOX = BoxSpec("v2", "http://127.0.0.1:2", EngineKind.VLLM, "tiny")


@dataclass
class Listener:
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def prefix_evicted(self, box_id: str, prefix_hash: str, resident_tokens: int) -> None:
        self.calls.append(("evicted", box_id, prefix_hash, str(resident_tokens)))

    def prefix_resident(self, box_id: str, prefix_hash: str) -> None:
        self.calls.append(("resident", box_id, prefix_hash))

    def box_reset(self, box_id: str, reason: ResetReason) -> None:
        self.calls.append(("reset", box_id, reason.value))


@dataclass
class Rig:
    watcher: CacheEventWatcher
    publisher: FakePublisher
    port: FakePort
    listener: Listener
    clock: TickClock
    tokenized: list[str]


def make_rig(
    boxes: Sequence[BoxSpec] = (BOX,),
    tokenize_error: Exception | None = None,
    epochs: dict[str, str] | None = None,
) -> Rig:
    publisher = FakePublisher()
    port = FakePort(publisher)
    listener = Listener()
    clock = TickClock()
    tokenized: list[str] = []

    async def tokenize(box: BoxSpec, text: str) -> list[int]:
        tokenized.append(text)
        if tokenize_error is not None:
            raise tokenize_error
        return [ord(c) for c in text]

    watcher = CacheEventWatcher(
        port=port,
        listener=listener,
        fleet=lambda: boxes,
        tokenize=tokenize,
        clock=clock,
        config=CacheEventsConfig(retry_seconds=2.0),
        epoch_of=(epochs if epochs is not None else {}).get,
    )
    return Rig(watcher, publisher, port, listener, clock, tokenized)


PROMPT = list(range(100, 112))  # three blocks of the fake's 4 tokens
PREFIX = Prefix(text="p", token_count=12, token_ids=tuple(PROMPT))


async def started(rig: Rig) -> None:
    rig.watcher.sync_boxes([BOX])
    await asyncio.sleep(0)
    await rig.publisher.settled()


def test_an_eviction_is_reported_as_it_happens_and_the_rewarm_as_resident() -> None:
    async def scenario() -> Rig:
        rig, cache = make_rig(), FakeCache()
        await started(rig)
        rig.publisher.publish(cache.store(PROMPT))
        await rig.publisher.settled()
        view = await rig.watcher.watch(BOX, PREFIX)  # after the warm: its blocks are in the mirror already
        assert view is not None
        assert view.state is PrefixState.RESIDENT
        rig.publisher.publish(cache.evict(PROMPT, 2))
        await rig.publisher.settled()
        rig.publisher.publish(cache.store(PROMPT, start_block=2))
        await rig.publisher.settled()
        await rig.watcher.close()
        return rig

    rig = asyncio.run(scenario())

    assert rig.listener.calls == [
        ("resident", "v1", PREFIX.hash),
        ("evicted", "v1", PREFIX.hash, "8"),
        ("resident", "v1", PREFIX.hash),
    ]
    assert rig.publisher.replays == []  # joined at batch 0: nothing to catch up
    assert rig.publisher.streams[-1].closed


def test_joining_a_running_stream_replays_its_history_from_zero() -> None:
    async def scenario() -> Rig:
        rig, cache = make_rig(), FakeCache()
        rig.publisher.streams.append(FakeStream(rig.publisher))  # published before warmer subscribed
        rig.publisher.publish(cache.store(PROMPT), deliver=False)
        rig.publisher.publish(cache.store(list(range(7, 15))), deliver=False)
        await started(rig)
        rig.publisher.publish(cache.evict(list(range(7, 15)), 0))
        await rig.publisher.settled()
        view = await rig.watcher.watch(BOX, PREFIX)
        assert view is not None
        assert view.state is PrefixState.RESIDENT
        await rig.watcher.close()
        return rig

    rig = asyncio.run(scenario())
    assert rig.publisher.replays == [0]


def test_a_missed_eviction_is_fetched_from_the_replay_socket() -> None:
    async def scenario() -> Rig:
        rig, cache = make_rig(), FakeCache()
        await started(rig)
        await rig.watcher.watch(BOX, PREFIX)
        rig.publisher.publish(cache.store(PROMPT))
        rig.publisher.publish(cache.evict(PROMPT, 0), deliver=False)  # lost on the way
        rig.publisher.publish(cache.store(list(range(7, 11))))
        await rig.publisher.settled()
        await rig.watcher.close()
        return rig

    rig = asyncio.run(scenario())

    assert rig.publisher.replays == [0]  # from the last batch applied: the same process answers it alike
    assert rig.listener.calls == [("resident", "v1", PREFIX.hash), ("evicted", "v1", PREFIX.hash, "0")]


@pytest.mark.parametrize(
    "replay_error", [NotSupported("v1", "no replay socket"), EngineUnavailable("v1", "down")]
)
def test_a_gap_that_cannot_be_replayed_makes_the_box_unknown(replay_error: Exception) -> None:
    async def scenario() -> Rig:
        rig, cache = make_rig(), FakeCache()
        await started(rig)
        await rig.watcher.watch(BOX, PREFIX)
        rig.publisher.publish(cache.store(PROMPT))
        rig.publisher.replay_error = replay_error
        rig.publisher.publish(cache.evict(PROMPT, 0), deliver=False)
        rig.publisher.publish(cache.store(list(range(7, 11))))
        await rig.publisher.settled()
        view = rig.watcher.state("v1", PREFIX.hash)
        assert view is not None
        assert view.state is PrefixState.UNKNOWN
        await rig.watcher.close()
        return rig

    rig = asyncio.run(scenario())
    assert rig.listener.calls == [("resident", "v1", PREFIX.hash), ("reset", "v1", "lost")]


def test_a_gap_older_than_the_replay_buffer_makes_the_box_unknown() -> None:
    async def scenario() -> Rig:
        rig, cache = make_rig(), FakeCache()
        rig.publisher.buffer_steps = 2
        await started(rig)
        await rig.watcher.watch(BOX, PREFIX)
        rig.publisher.publish(cache.store(PROMPT))
        for start in (7, 11, 15):
            rig.publisher.publish(cache.store(list(range(start, start + 4))), deliver=False)
        rig.publisher.publish(cache.store(list(range(40, 44))))
        await rig.publisher.settled()
        await rig.watcher.close()
        return rig

    rig = asyncio.run(scenario())
    assert rig.publisher.replays == [0]
    assert rig.listener.calls[-1] == ("reset", "v1", "lost")


async def restarted_after_two_batches(rig: Rig) -> FakeCache:
    """The prefix watched and stored by an old process (batches 0 and 1), then a new process publishing
    with a new seed (its cache, returned) from batch 0."""
    old = FakeCache(salt=1)
    await started(rig)
    await rig.watcher.watch(BOX, PREFIX)
    rig.publisher.publish(old.store(PROMPT))
    rig.publisher.publish(old.store(list(range(7, 11))))
    await rig.publisher.settled()
    rig.publisher.restart()
    return FakeCache(salt=2)


def test_a_sequence_reset_is_a_restart_without_per_prefix_evictions() -> None:
    async def scenario() -> Rig:
        rig = make_rig()
        new = await restarted_after_two_batches(rig)
        rig.publisher.publish(new.store(list(range(50, 54))))
        await rig.publisher.settled()
        view = rig.watcher.state("v1", PREFIX.hash)
        assert view is not None
        assert view.state is PrefixState.EVICTED
        rig.publisher.publish(new.store(PROMPT))  # the re-warm on the new process
        await rig.publisher.settled()
        await rig.watcher.close()
        return rig

    rig = asyncio.run(scenario())
    assert rig.listener.calls == [
        ("resident", "v1", PREFIX.hash),
        ("reset", "v1", "restarted"),
        ("resident", "v1", PREFIX.hash),
    ]


def test_a_new_process_whose_first_batches_were_missed_is_a_restart_not_a_gap() -> None:
    """The old process's last batch was 1; the new one published 0..4 while warmer was not listening, so its
    5 looks like a gap after 1. Replayed from the last batch applied (1), the publisher answers its own
    batch 1, not the one warmer applied: a new process. The mirror is cleared (the old blocks are not in the
    new process) and the new process's history is applied from 0."""

    async def scenario() -> Rig:
        rig = make_rig()
        new = await restarted_after_two_batches(rig)
        for start in range(50, 70, 4):
            rig.publisher.publish(new.store(list(range(start, start + 4))), deliver=False)
        rig.publisher.publish(new.store(list(range(90, 94))))
        await rig.publisher.settled()
        view = rig.watcher.state("v1", PREFIX.hash)
        assert view is not None
        assert view.state is PrefixState.EVICTED  # not RESIDENT on the old process's blocks
        await rig.watcher.close()
        return rig

    rig = asyncio.run(scenario())
    assert rig.publisher.replays == [1, 0]  # the last batch applied, then the new process from 0
    assert rig.listener.calls == [("resident", "v1", PREFIX.hash), ("reset", "v1", "restarted")]


def test_a_changed_engine_identity_is_a_restart_even_when_the_numbers_run_on() -> None:
    """Missed batches 0..2 of a new process whose old one ended at 1: batch 2 would read as the NEXT one.
    The box's epoch (the engine's own identity) changed since the stream started: a new process."""

    async def scenario() -> Rig:
        epochs = {"v1": "e1"}
        rig = make_rig(epochs=epochs)
        new = await restarted_after_two_batches(rig)
        epochs["v1"] = "e2"
        rig.publisher.publish(new.store(list(range(50, 54))), deliver=False)
        rig.publisher.publish(new.store(list(range(54, 58))), deliver=False)
        rig.publisher.publish(new.store(list(range(58, 62))))
        await rig.publisher.settled()
        await rig.watcher.close()
        return rig

    rig = asyncio.run(scenario())
    assert rig.listener.calls == [("resident", "v1", PREFIX.hash), ("reset", "v1", "restarted")]
    assert rig.publisher.replays == [0]


class RankedPort:
    """One publisher per data-parallel rank, each on its own port (`subscribe(box, rank)`)."""

    def __init__(self, ranks: int) -> None:
        self.publishers = [FakePublisher() for _ in range(ranks)]
        self.subscribed: list[tuple[str, int]] = []

    def subscribe(self, box: BoxSpec, rank: int = 0) -> FakeStream:
        self.subscribed.append((box.id, rank))
        stream = FakeStream(self.publishers[rank])
        self.publishers[rank].streams.append(stream)
        return stream


def test_each_data_parallel_rank_is_its_own_stream_and_a_prefix_is_resident_only_on_all() -> None:
    """vLLM / SGLang with data parallelism: each rank has its own cache and publishes on port + rank. A
    prefix warmed on every rank is RESIDENT once every rank stored it, EVICTED when one rank drops it."""

    async def scenario() -> tuple[RankedPort, Listener, list[object]]:
        port, listener = RankedPort(2), Listener()

        async def two_ranks(box: BoxSpec) -> CacheLayout:
            return CacheLayout(data_parallel_ranks=2)

        watcher = CacheEventWatcher(
            port=port,
            listener=listener,
            fleet=lambda: [BOX],
            tokenize=lambda box, text: asyncio.sleep(0, result=[]),
            clock=TickClock(),
            layout_of=two_ranks,
        )
        await watcher.sync_fleet([BOX])
        await asyncio.sleep(0)
        for publisher in port.publishers:
            await publisher.settled()
        await watcher.watch(BOX, PREFIX)
        caches = [FakeCache(salt=1), FakeCache(salt=2)]  # each rank's own hashes
        seen: list[object] = []
        port.publishers[0].publish(caches[0].store(PROMPT))
        await port.publishers[0].settled()
        seen.append(getattr(watcher.state("v1", PREFIX.hash), "state", None))
        port.publishers[1].publish(caches[1].store(PROMPT))
        await port.publishers[1].settled()
        seen.append(getattr(watcher.state("v1", PREFIX.hash), "state", None))
        port.publishers[1].publish(caches[1].evict(PROMPT, 1))
        await port.publishers[1].settled()
        seen.append(getattr(watcher.state("v1", PREFIX.hash), "state", None))
        await watcher.close()
        return port, listener, seen

    port, listener, seen = asyncio.run(scenario())
    assert port.subscribed == [("v1", 0), ("v1", 1)]
    assert seen == [PrefixState.UNKNOWN, PrefixState.RESIDENT, PrefixState.EVICTED]
    assert ("evicted", "v1", PREFIX.hash, "4") in listener.calls


def test_all_blocks_cleared_evicts_each_watched_prefix() -> None:
    async def scenario() -> Rig:
        rig, cache = make_rig(), FakeCache()
        await started(rig)
        await rig.watcher.watch(BOX, PREFIX)
        rig.publisher.publish(cache.store(PROMPT))
        rig.publisher.publish(AllBlocksCleared())
        await rig.publisher.settled()
        await rig.watcher.close()
        return rig

    rig = asyncio.run(scenario())
    assert rig.listener.calls == [("resident", "v1", PREFIX.hash), ("evicted", "v1", PREFIX.hash, "0")]


def test_an_unreadable_batch_loses_track_and_the_stream_is_reopened() -> None:
    async def scenario() -> Rig:
        rig, cache = make_rig(), FakeCache()
        await started(rig)
        await rig.watcher.watch(BOX, PREFIX)
        rig.publisher.publish(cache.store(PROMPT))
        await rig.publisher.settled()
        first = rig.publisher.streams[-1]
        rig.publisher.deliver(MalformedResponse("v1", "KV event batch 1: garbage"))
        await rig.port.subscriptions(2)
        await rig.publisher.settled()
        assert first.closed
        rig.publisher.publish(cache.store(list(range(7, 11))))  # the reopened stream replays from 0
        await rig.publisher.settled()
        await rig.watcher.close()
        return rig

    rig = asyncio.run(scenario())
    assert rig.port.subscribed == ["v1", "v1"]
    assert rig.clock.sleeps == [2.0]
    assert rig.publisher.replays == [0]
    assert rig.listener.calls == [
        ("resident", "v1", PREFIX.hash),
        ("reset", "v1", "lost"),
        ("resident", "v1", PREFIX.hash),  # relearned from the replayed history
    ]


def test_a_text_prefix_is_tokenized_by_the_engine_to_be_watched() -> None:
    async def scenario() -> tuple[Rig, object]:
        rig, cache = make_rig(), FakeCache()
        await started(rig)
        text = "abcdefgh"
        rig.publisher.publish(cache.store([ord(c) for c in text]))
        await rig.publisher.settled()
        view = await rig.watcher.watch(BOX, Prefix(text=text, token_count=8))
        await rig.watcher.close()
        return rig, view

    rig, view = asyncio.run(scenario())
    assert rig.tokenized == ["abcdefgh"]
    assert getattr(view, "state", None) is PrefixState.RESIDENT


def test_a_prefix_the_engine_cannot_tokenize_is_not_watched() -> None:
    async def scenario() -> object:
        rig = make_rig(tokenize_error=EngineUnavailable("v1", "down"))
        await started(rig)
        view = await rig.watcher.watch(BOX, Prefix(text="abcd", token_count=4))
        await rig.watcher.close()
        return view

    assert asyncio.run(scenario()) is None


def test_only_boxes_with_an_event_stream_are_followed_and_removed_boxes_stop() -> None:
    async def scenario() -> Rig:
        rig = make_rig()
        rig.watcher.sync_boxes([BOX, PLAIN_BOX])
        await asyncio.sleep(0)
        await rig.publisher.settled()
        assert rig.watcher.follows("v1")
        assert not rig.watcher.follows("v2")
        assert await rig.watcher.watch(PLAIN_BOX, PREFIX) is None
        rig.watcher.sync_boxes([PLAIN_BOX])
        await asyncio.sleep(0)
        assert not rig.watcher.follows("v1")
        assert rig.watcher.state("v1", PREFIX.hash) is None
        return rig

    rig = asyncio.run(scenario())
    assert rig.port.subscribed == ["v1"]
    assert rig.publisher.streams[-1].closed


def test_the_root_task_follows_the_fleet_until_stopped() -> None:
    async def scenario() -> Rig:
        rig, cache = make_rig(), FakeCache()
        stopping = asyncio.Event()
        task = asyncio.create_task(rig.watcher.run(stopping))
        await rig.port.subscriptions(1)
        await rig.publisher.settled()
        await rig.watcher.watch(BOX, PREFIX)
        rig.publisher.publish(cache.store(PROMPT))
        await rig.publisher.settled()
        stopping.set()
        await task
        return rig

    rig = asyncio.run(scenario())
    assert rig.listener.calls == [("resident", "v1", PREFIX.hash)]
    assert rig.publisher.streams[-1].closed
    assert not rig.watcher.follows("v1")


def test_config_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="retry_seconds"):
        CacheEventsConfig(retry_seconds=0)
    with pytest.raises(ValueError, match="max_blocks"):
        CacheEventsConfig(max_blocks=0)
