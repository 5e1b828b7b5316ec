"""Fakes at the KV event seam: an engine prefix cache emitting events as vLLM does, and an event port.

`FakePublisher` numbers batches from 0 per process and keeps a replay buffer, as vLLM's
`ZmqEventPublisher` does (`vllm/distributed/kv_events.py`); a batch it does not deliver live is one the
subscriber missed. `FakePort` hands out `FakeStream`s over it (`warmer.ports.CacheEventPort`).

As `vllm/v1/core/block_pool.py` builds them (`cache_full_blocks` / `_maybe_evict_cached_block`): one
`BlockStored` per run of newly full blocks of one request, its `parent_block_hash` the hash of the block
before the run (None from the start), `token_ids` the run's tokens; one `BlockRemoved` per evicted block.
Hashes chain over the parent hash and the block's tokens from a per-process seed, as vLLM's do
(`vllm/v1/core/kv_cache_utils.py`, `hash_block_tokens`, `NONE_HASH`); the hash function is the fake's own,
only the chaining matters to warmer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from warmer.core.kv_event_stream import BlockHash, BlockRemoved, BlockStored, CacheEvent, EventBatch
from warmer.core.model import BoxSpec

BS = 4  # block size of the fake engine


@dataclass
class FakeCache:
    """Hash chaining as vLLM does it: a block's hash covers its parent's hash and its own tokens."""

    block_size: int = BS
    salt: int = 0  # a new process draws a new seed (NONE_HASH): same tokens, other hashes
    held: set[BlockHash] = field(default_factory=set)

    def hashes(self, tokens: Sequence[int]) -> list[int]:
        out: list[int] = []
        parent: int | None = None
        for i in range(len(tokens) // self.block_size):
            block = tuple(tokens[i * self.block_size : (i + 1) * self.block_size])
            parent = hash(("blk", self.salt, parent, block)) & 0xFFFF_FFFF_FFFF_FFFF
            out.append(parent)
        return out

    def store(
        self, tokens: Sequence[int], *, start_block: int = 0, end_block: int | None = None
    ) -> BlockStored:
        """The BlockStored of a request that made blocks [start_block, end_block) of `tokens` full."""
        hashes = self.hashes(tokens)
        end = len(hashes) if end_block is None else end_block
        run = hashes[start_block:end]
        for h in run:
            self.held.add(h)
        return BlockStored(
            block_hashes=tuple(run),
            parent_hash=hashes[start_block - 1] if start_block else None,
            token_ids=tuple(tokens[start_block * self.block_size : end * self.block_size]),
            block_size=self.block_size,
        )

    def evict(self, tokens: Sequence[int], block: int) -> BlockRemoved:
        h = self.hashes(tokens)[block]
        self.held.discard(h)
        return BlockRemoved(block_hashes=(h,))


class TickClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds
        await asyncio.sleep(0)


@dataclass
class FakeStream:
    publisher: FakePublisher
    live: asyncio.Queue[EventBatch | Exception] = field(default_factory=asyncio.Queue)
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False

    async def receive(self) -> EventBatch:
        if self.live.empty():
            self.idle.set()
        item = await self.live.get()
        if isinstance(item, Exception):
            raise item
        return item

    async def replay(self, start_seq: int) -> list[EventBatch]:
        self.publisher.replays.append(start_seq)
        if self.publisher.replay_error is not None:
            raise self.publisher.replay_error
        return [b for b in self.publisher.buffer if b.seq >= start_seq]

    async def aclose(self) -> None:
        self.closed = True


@dataclass
class FakePublisher:
    buffer_steps: int = 100
    buffer: list[EventBatch] = field(default_factory=list)
    next_seq: int = 0
    replays: list[int] = field(default_factory=list)
    replay_error: Exception | None = None
    restarts: int = 0
    streams: list[FakeStream] = field(default_factory=list)

    def publish(self, *events: CacheEvent, deliver: bool = True) -> EventBatch:
        ts = float(self.next_seq + 1000 * self.restarts)  # the engine's clock moves on across processes
        batch = EventBatch(seq=self.next_seq, ts=ts, events=tuple(events))
        self.next_seq += 1
        self.buffer = [*self.buffer, batch][-self.buffer_steps :]
        if deliver:
            self.deliver(batch)
        return batch

    def deliver(self, item: EventBatch | Exception) -> None:
        stream = self.streams[-1]
        stream.idle.clear()
        stream.live.put_nowait(item)

    def restart(self) -> None:
        """A new engine process: numbering from 0, an empty replay buffer."""
        self.buffer, self.next_seq = [], 0
        self.restarts += 1

    async def settled(self) -> None:
        """Until the watcher has taken everything delivered and waits for more."""
        await self.streams[-1].idle.wait()


class FakePort:
    def __init__(self, publisher: FakePublisher) -> None:
        self.publisher = publisher
        self.subscribed: list[str] = []
        self.changed = asyncio.Event()

    async def subscriptions(self, count: int) -> None:
        while len(self.subscribed) < count:
            self.changed.clear()
            await self.changed.wait()

    def subscribe(self, box: BoxSpec, rank: int = 0) -> FakeStream:
        self.subscribed.append(box.id if rank == 0 else f"{box.id}:{rank}")
        self.changed.set()
        stream = FakeStream(self.publisher)
        self.publisher.streams.append(stream)
        return stream
