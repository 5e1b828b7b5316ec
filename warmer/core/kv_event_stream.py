"""A box's KV cache event stream as warmer reads it: the events, their numbering, and the eviction horizon
they measure. `residency` keeps what the events say the cache holds.

vLLM (`--kv-events-config`) and SGLang publish every change to their prefix cache: `BlockStored` (full blocks
that became reusable), `BlockRemoved` (hashes evicted), `AllBlocksCleared` (the whole cache reset).

The stream is numbered: each batch carries a sequence number from 0 per publisher process
(`vllm/distributed/kv_events.py`, `ZmqEventPublisher`: `count()`). A gap is filled from the replay socket;
a number going backwards is a new publisher, i.e. an engine restart, whose cache starts empty.
"""

from __future__ import annotations

import enum
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

BlockHash = int | bytes


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks that became reusable: `token_ids` is their tokens, `block_size` per block."""

    block_hashes: tuple[BlockHash, ...]
    parent_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    group: int = 0  # KV cache group (hybrid models have several); None on the wire is group 0
    medium: str | None = None
    plain: bool = True  # no LoRA and no extra hash keys: a block a warm request can have stored
    sparse: bool = False  # the group's kind keeps only some positions (sliding window, Mamba)


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    group: int = 0
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine emptied its prefix cache (`reset_prefix_cache`)."""


CacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One published message: its sequence number, the engine's timestamp, its events in order."""

    seq: int
    ts: float
    events: tuple[CacheEvent, ...]
    rank: int | None = None  # the publisher's data-parallel rank, when it says


class SeqVerdict(enum.StrEnum):
    FIRST = "first"  # nothing seen yet from this stream
    NEXT = "next"
    GAP = "gap"  # batches were missed: replay them from `SequenceCursor.expected`
    RESET = "reset"  # the number went backwards: a new publisher process (an engine restart)


@dataclass(slots=True)
class SequenceCursor:
    """The last sequence number applied from one publisher."""

    last: int | None = None

    @property
    def expected(self) -> int:
        return 0 if self.last is None else self.last + 1

    def classify(self, seq: int) -> SeqVerdict:
        if self.last is None:
            return SeqVerdict.FIRST
        if seq == self.last + 1:
            return SeqVerdict.NEXT
        if seq > self.last + 1:
            return SeqVerdict.GAP
        return SeqVerdict.RESET

    def advance(self, seq: int) -> None:
        self.last = seq


def replay_covers(start: int, replayed: Sequence[EventBatch]) -> bool:
    """Whether a replay answer holds every batch from `start` on (its buffer may have dropped the oldest)."""
    return bool(replayed) and replayed[0].seq <= start


class EvictionHorizon:
    """How long an unused block lasts in the engine's cache before the engine evicts it: the age at eviction
    of blocks no watched prefix holds (other traffic's), measured on the engine's own event timestamps.

    vLLM evicts least recently used first: a freed cached block is appended to the tail of
    `FreeKVCacheBlockQueue` and `BlockPool.get_new_blocks` pops from its head, evicting as it goes; a hit
    (`BlockPool.touch`) takes the block off the queue until its request ends (vllm-project/vllm
    `vllm/v1/core/kv_cache_utils.py` @ 001cabc1be16a59a70d720ed61a13b678c060a18, `FreeKVCacheBlockQueue`:
    "The least recent used block is at the front"; `vllm/v1/core/block_pool.py`
    @ c59cb7941357443da7c5eef75cfa8697d683d228, `get_new_blocks`, `touch`, `free_blocks`). So a block stored
    at t and evicted at t + a says the pool turns over in `a` at most: a prefix nobody touches for longer is
    gone. The age is counted from the block's last `BlockStored` (a hit by other traffic announces nothing,
    so an age can only overstate how long a block sat unused): a low quantile of the recent ages is taken,
    never the mean. None until `min_samples` evictions were seen."""

    def __init__(self, *, window: int = 256, min_samples: int = 8, quantile: float = 0.1) -> None:
        if window < 1 or min_samples < 1 or not 0.0 < quantile < 1.0:
            raise ValueError("window and min_samples must be >= 1, quantile in (0, 1)")
        self._ages: deque[float] = deque(maxlen=window)
        self._min_samples = min_samples
        self._quantile = quantile

    def add(self, age_seconds: float) -> None:
        if age_seconds >= 0.0:
            self._ages.append(age_seconds)

    @property
    def samples(self) -> int:
        return len(self._ages)

    def seconds(self) -> float | None:
        """The horizon: the `quantile` of the recent ages at eviction (None: too few seen yet)."""
        if len(self._ages) < self._min_samples:
            return None
        cuts = statistics.quantiles(self._ages, n=100, method="inclusive")
        return cuts[max(0, round(self._quantile * 100) - 1)]
