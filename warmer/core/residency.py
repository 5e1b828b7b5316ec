"""Which warmed prefixes a box's KV cache still holds, from the engine's own cache events.

vLLM (`--kv-events-config`) publishes every change to its prefix cache: `BlockStored` (full blocks that
became reusable, with their token ids, the hash of each and the hash of the block before the first),
`BlockRemoved` (hashes evicted), `AllBlocksCleared` (the whole cache reset). A block's hash chains over
its parent's hash, its tokens and extra keys (LoRA, cache salt, multimodal inputs), from a per-process
random seed unless PYTHONHASHSEED is set (`vllm/v1/core/kv_cache_utils.py`, `hash_block_tokens`,
`NONE_HASH`), so warmer cannot compute the hashes itself: it learns them.

The learning needs no guess about which request stored what. Every stored plain block (no LoRA, no extra
keys, the engine's own GPU cache) is indexed by (parent hash, digest of its tokens); a warmed prefix's
token ids cut into the event's block size give the same digests, so walking the index from the root
(parent None) gives the prefix's block hashes, whichever request stored them. The index mirrors what the
engine holds (a block leaves it on `BlockRemoved`), so it is bounded by the engine's own cache size.

A prefix is RESIDENT when every one of its full blocks is held, EVICTED when it was learned (or the cache
is known to be empty) and a block is gone, UNKNOWN while its blocks were never all seen. UNKNOWN is the
honest answer after warmer (re)subscribes to a process whose earlier events it missed: a warm that hits
already-cached blocks stores nothing new, so nothing announces them, and such a prefix keeps the
timer/probe path. A hit reaches only as far as the first missing block (the chain is matched from its
start), so `resident_tokens` is the blocks held from the start times the block size.

Hybrid models keep several KV cache groups (full attention, sliding window, Mamba), each with its own
events (`group_idx`). For sliding-window and Mamba groups ("align" prefix caching) most positions hold the
null block: `BlockPool.cache_full_blocks` skips null blocks in `block_hashes` but still sends `token_ids`
for the whole run (vllm-project/vllm `vllm/v1/core/block_pool.py`
@ c59cb7941357443da7c5eef75cfa8697d683d228: "Some blocks may be null blocks when enabling sparse attention
like sliding window attention, or Mamba models with prefix-caching in align mode. We skip null blocks
here."). The hashes are the request's own block hashes (`request.block_hashes`, the same for every group
of one block size), so such a "sparse" group is tracked by the hashes it holds, and a prefix needs, in it,
the block at the prefix's end (the state a hit resumes from), whose hash its full-attention chain gives. A
group is sparse once one of its events carries fewer hashes than its tokens make blocks, or says its kind
is sliding window or Mamba (`kv_cache_spec_kind`). A prefix is RESIDENT only while every group holds what
it needs; a sparse group whose needed block is gone makes it EVICTED with nothing resident.

Where the server's hashes are reproducible (vLLM with a fixed PYTHONHASHSEED and sha256_cbor), a `hasher`
gives each watched prefix its own block hashes: a `BlockRemoved` naming one of them is an eviction even
when its store was never seen (a prefix warmed before warmer subscribed), instead of leaving it UNKNOWN.

A hash is held or not: a second `BlockStored` of a held hash changes nothing and one `BlockRemoved`
drops it. vLLM does not de-duplicate blocks (two requests computing one prefix at once may each cache a
copy; `vllm/v1/core/block_pool.py`), so a removal may leave a copy behind, and with a request's
`kv_cache_report_mode` "full" it re-announces the cached blocks a hit reused (`emit_cached_block_events`)
without a new copy. Counting copies would then miss evictions; a spare copy only costs a re-warm that hits.

The events themselves, their numbering and the eviction horizon they measure: `kv_event_stream`.

Size: the mirror of stored blocks, the walk that matches a watched prefix against it and the sparse groups
of hybrid models change together; apart they would share every index.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from warmer.core.kv_event_stream import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    CacheEvent,
    EvictionHorizon,
)

# A prefix's block hashes as the engine computes them (token ids, block size), where reproducible
BlockHasher = Callable[[Sequence[int], int], tuple[BlockHash, ...]]
_GPU_MEDIA = (None, "GPU")  # vLLM's own prefix cache; offloaded copies (e.g. "CPU") are not it


class PrefixState(enum.StrEnum):
    UNKNOWN = "unknown"  # its blocks were never all seen stored (or the stream lost track)
    RESIDENT = "resident"  # every full block of it is in the cache
    EVICTED = "evicted"  # at least one of its blocks is known to be gone


@dataclass(frozen=True, slots=True)
class PrefixResidency:
    prefix_hash: str
    state: PrefixState
    resident_tokens: int  # tokens of the prefix held from its start (a hit reaches that far)
    tracked_tokens: int  # tokens in the prefix's full blocks: what RESIDENT covers (0: block size unknown)
    block_tokens: int = 0  # the engine's block size (the largest of its groups'; 0: not known yet)


def block_digests(token_ids: Sequence[int], block_size: int) -> tuple[int, ...]:
    """Digest of each full block of `token_ids` (a trailing partial block is never cached)."""
    full = len(token_ids) // block_size
    return tuple(hash(tuple(token_ids[i * block_size : (i + 1) * block_size])) for i in range(full))


@dataclass(frozen=True, slots=True)
class _Block:
    parent: BlockHash | None
    digest: int
    at: float | None = None  # the engine's timestamp of its last BlockStored


@dataclass(slots=True)
class _Watched:
    prefix_hash: str
    token_ids: tuple[int, ...]
    state: PrefixState = PrefixState.UNKNOWN
    resident_tokens: int = 0
    digests: dict[int, tuple[int, ...]] = field(default_factory=dict)  # per block size
    chain: list[tuple[int, BlockHash]] = field(default_factory=list)  # (group, hash) of held blocks
    frontier: list[tuple[int, BlockHash | None, int]] = field(default_factory=list)  # next block per group
    needs: list[tuple[int, BlockHash]] = field(default_factory=list)  # sparse groups' missing end blocks
    known: list[BlockHash] = field(default_factory=list)  # its computed hashes (bytes and int forms)
    lost: bool = False  # a computed hash of it was removed: evicted, whether or not its store was seen

    def digests_for(self, block_size: int) -> tuple[int, ...]:
        cached = self.digests.get(block_size)
        if cached is None:
            cached = self.digests[block_size] = block_digests(self.token_ids, block_size)
        return cached


def _both_forms(hashes: Sequence[BlockHash]) -> list[BlockHash]:
    """Each hash as bytes and as vLLM's int form (the low 64 bits of the big-endian bytes, sent with
    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES; `vllm/v1/core/kv_cache_utils.py` `maybe_convert_block_hash`)."""
    out: list[BlockHash] = []
    for h in hashes:
        out.append(h)
        if isinstance(h, bytes):
            out.append(int.from_bytes(h, "big") & 0xFFFF_FFFF_FFFF_FFFF)
    return out


class MirrorOverflow(Exception):
    """The mirror grew past its bound: removals were missed (the engine's cache cannot hold that many)."""


class BoxResidency:
    """One engine process's cache, as its events tell it, and the state of each watched prefix.

    Every mutating call returns only the prefixes whose state differs from before the call, so a caller
    reacts once per transition (how far an evicted prefix still reaches is in `state`).
    """

    def __init__(
        self,
        *,
        max_blocks: int = 2_000_000,
        hasher: BlockHasher | None = None,
        block_size_hint: int | None = None,
    ) -> None:
        """`hasher`: the server's own block hashes, where reproducible; `block_size_hint`: its block size
        as the server reports it, for hashing before any event has told it."""
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        self._max_blocks = max_blocks
        self._hasher = hasher
        self._block_size_hint = block_size_hint
        self._known: dict[BlockHash, set[str]] = {}  # a computed hash -> watched prefixes it belongs to
        self._live: dict[tuple[int, BlockHash], _Block] = {}
        self._child: dict[tuple[int, BlockHash | None, int], BlockHash] = {}
        self._block_size: dict[int, int] = {}  # per group, from its events
        self._watched: dict[str, _Watched] = {}
        self._holders: dict[tuple[int, BlockHash], set[str]] = {}  # held block -> prefixes through it
        self._waiting: dict[tuple[int, BlockHash | None, int], set[str]] = {}  # next block -> prefixes
        self._sparse: set[int] = set()  # groups that keep only some positions (null blocks skipped)
        self._needed: dict[tuple[int, BlockHash], set[str]] = {}  # a sparse group's block -> prefixes
        self._before: dict[str, PrefixState] = {}  # each prefix's state before the running call
        self.horizon = EvictionHorizon()

    @property
    def blocks(self) -> int:
        """Plain blocks the engine holds, as far as the events said."""
        return len(self._live)

    def watched(self) -> list[str]:
        return list(self._watched)

    def state(self, prefix_hash: str) -> PrefixResidency | None:
        watched = self._watched.get(prefix_hash)
        return None if watched is None else self._view(watched)

    def watch(self, prefix_hash: str, token_ids: Sequence[int]) -> list[PrefixResidency]:
        """Follow a prefix by the engine's token ids for it; blocks already held count at once."""
        ids = tuple(token_ids)
        existing = self._watched.get(prefix_hash)
        if existing is not None and existing.token_ids == ids:
            return []
        self.forget(prefix_hash)
        watched = self._watched[prefix_hash] = _Watched(prefix_hash, ids)
        self._before[prefix_hash] = watched.state
        self._walk(watched)
        return self._changes()

    def forget(self, prefix_hash: str) -> None:
        watched = self._watched.pop(prefix_hash, None)
        if watched is not None:
            self._unlink(watched)

    def apply(self, events: Iterable[CacheEvent], ts: float | None = None) -> list[PrefixResidency]:
        """Apply one batch's events in order; `ts` is the batch's engine timestamp (for the horizon).

        Raises MirrorOverflow when the mirror outgrows `max_blocks` (then call `lose_track`)."""
        touched: dict[str, _Watched] = {}
        for event in events:
            if isinstance(event, AllBlocksCleared):
                touched.clear()
                self._clear()
            elif event.medium not in _GPU_MEDIA:
                continue
            elif isinstance(event, BlockStored):
                self._store(event, touched, ts)
            else:
                self._remove(event, touched, ts)
        self._settle(touched)
        if len(self._live) > self._max_blocks:
            raise MirrorOverflow(f"{len(self._live)} blocks held > {self._max_blocks}")
        return self._changes()

    def clear(self) -> list[PrefixResidency]:
        """The cache is known to be empty (restart, `AllBlocksCleared`): every watched prefix is gone."""
        self._clear()
        return self._changes()

    def lose_track(self) -> list[PrefixResidency]:
        """Events were missed beyond repair: nothing is known any more, the learning starts over."""
        self._drop_mirror()
        self._block_size.clear()
        self._sparse.clear()
        for watched in self._watched.values():
            self._note(watched)
            watched.state, watched.resident_tokens, watched.lost = PrefixState.UNKNOWN, 0, False
        return self._changes()

    # -- the mirror

    def _clear(self) -> None:
        self._drop_mirror()
        for watched in self._watched.values():
            self._note(watched)
            if self._tracked_tokens(watched) > 0 or watched.state is not PrefixState.UNKNOWN:
                watched.state = PrefixState.EVICTED
            self._walk(watched)

    def _drop_mirror(self) -> None:
        self._live.clear()
        self._child.clear()
        self._holders.clear()
        self._waiting.clear()
        self._needed.clear()
        for watched in self._watched.values():
            watched.chain.clear()
            watched.frontier.clear()
            watched.needs.clear()

    def _store(self, event: BlockStored, touched: dict[str, _Watched], ts: float | None) -> None:
        if not event.plain or event.block_size < 1:
            return
        blocks, rest = divmod(len(event.token_ids), event.block_size)
        if rest or len(event.block_hashes) > blocks:
            return  # not one run of full blocks: nothing to index it by
        if event.sparse or len(event.block_hashes) < blocks or event.group in self._sparse:
            self._store_sparse(event, touched, ts)
            return
        new_size = self._block_size.get(event.group) != event.block_size
        self._block_size[event.group] = event.block_size
        parent = event.parent_hash
        size = event.block_size
        for i, block_hash in enumerate(event.block_hashes):
            digest = hash(tuple(event.token_ids[i * size : (i + 1) * size]))
            key = (event.group, block_hash)
            if key not in self._live:
                self._child[(event.group, parent, digest)] = block_hash
            self._live[key] = _Block(parent, digest, ts)  # a re-announced block was just used again
            for prefix_hash in self._waiting.get((event.group, parent, digest), ()):
                touched[prefix_hash] = self._watched[prefix_hash]
            parent = block_hash
        if new_size:
            touched.update(self._watched)

    def _store_sparse(self, event: BlockStored, touched: dict[str, _Watched], ts: float | None) -> None:
        """A group that skips null blocks: which hashes it holds is all there is to know."""
        if event.group not in self._sparse or self._block_size.get(event.group) != event.block_size:
            self._sparse.add(event.group)
            self._block_size[event.group] = event.block_size
            touched.update(self._watched)  # a group (or its block size) every prefix now needs
        for block_hash in event.block_hashes:
            self._live[(event.group, block_hash)] = _Block(None, 0, ts)
            for prefix_hash in self._needed.get((event.group, block_hash), ()):
                touched[prefix_hash] = self._watched[prefix_hash]

    def _remove(self, event: BlockRemoved, touched: dict[str, _Watched], ts: float | None) -> None:
        for block_hash in event.block_hashes:
            key = (event.group, block_hash)
            block = self._live.pop(key, None)
            if block is None:
                for prefix_hash in self._known.get(block_hash, ()):  # a computed hash, store unseen
                    watched = self._watched[prefix_hash]
                    watched.lost = True
                    touched[prefix_hash] = watched
                continue
            if ts is not None and block.at is not None and key not in self._holders:
                self.horizon.add(ts - block.at)  # another prefix's block: how long unused ones last
            child_key = (event.group, block.parent, block.digest)
            if self._child.get(child_key) == block_hash:
                del self._child[child_key]
            for prefix_hash in self._holders.get(key, ()):
                touched[prefix_hash] = self._watched[prefix_hash]

    # -- watched prefixes

    def _note(self, watched: _Watched) -> None:
        self._before.setdefault(watched.prefix_hash, watched.state)

    def _changes(self) -> list[PrefixResidency]:
        changed = []
        for prefix_hash, before in self._before.items():
            watched = self._watched.get(prefix_hash)
            if watched is not None and watched.state is not before:
                changed.append(self._view(watched))
        self._before.clear()
        return changed

    def _settle(self, touched: dict[str, _Watched]) -> None:
        for watched in touched.values():
            self._note(watched)
            self._walk(watched)
        touched.clear()

    def _walk(self, watched: _Watched) -> None:
        """Follow the prefix's blocks from the root in every full group (the shortest run held decides),
        then ask each sparse group for the block at the prefix's end."""
        self._unlink(watched)
        if self._hasher is not None and not watched.known:
            full = [size for group, size in sorted(self._block_size.items()) if group not in self._sparse]
            size = full[0] if full else self._block_size_hint
            if size:
                watched.known = _both_forms(self._hasher(watched.token_ids, size))
        resident: int | None = None
        complete = bool(self._block_size)
        chains: dict[int, list[BlockHash]] = {}  # block size -> the prefix's whole chain, where held
        for group, size in sorted(self._block_size.items()):
            if group in self._sparse:
                continue
            digests = watched.digests_for(size)
            parent: BlockHash | None = None
            held = 0
            for digest in digests:
                block_hash = self._child.get((group, parent, digest))
                if block_hash is None:
                    break
                watched.chain.append((group, block_hash))
                parent = block_hash
                held += 1
            if held < len(digests):
                watched.frontier.append((group, parent, digests[held]))
            if not digests or held < len(digests):
                complete = False
            elif size not in chains:
                chains[size] = [h for g, h in watched.chain if g == group]
            tokens = held * size
            resident = tokens if resident is None else min(resident, tokens)
        for group in sorted(self._sparse):
            size = self._block_size[group]
            chain = chains.get(size)
            end = None if chain is None else chain[-1]
            if end is not None and (group, end) in self._live:
                watched.chain.append((group, end))
                tokens = len(chain or ()) * size
            else:
                complete = False  # its end block is gone, or which hash it is is not known yet
                if end is not None:
                    watched.needs.append((group, end))
                tokens = 0
            resident = tokens if resident is None else min(resident, tokens)
        watched.resident_tokens = resident or 0
        if complete:
            watched.state, watched.lost = PrefixState.RESIDENT, False
        elif watched.state is not PrefixState.UNKNOWN or watched.lost:
            watched.state = PrefixState.EVICTED
        self._link(watched)

    def _indexes(self, watched: _Watched) -> list[tuple[dict[Any, set[str]], Sequence[Any]]]:
        """Each reverse index (key -> prefixes) with the prefix's keys in it."""
        return [
            (self._holders, watched.chain),
            (self._waiting, watched.frontier),
            (self._needed, watched.needs),
            (self._known, watched.known),
        ]

    def _link(self, watched: _Watched) -> None:
        for index, keys in self._indexes(watched):
            for key in keys:
                index.setdefault(key, set()).add(watched.prefix_hash)

    def _unlink(self, watched: _Watched) -> None:
        """Out of every index; its walk's results cleared (its computed hashes are kept for the next)."""
        for index, keys in self._indexes(watched):
            for key in keys:
                prefixes = index.get(key)
                if prefixes is not None:
                    prefixes.discard(watched.prefix_hash)
                    if not prefixes:
                        del index[key]
        watched.chain.clear()
        watched.frontier.clear()
        watched.needs.clear()

    def _tracked_tokens(self, watched: _Watched) -> int:
        sizes = [size * len(watched.digests_for(size)) for size in self._block_size.values()]
        return min(sizes) if sizes else 0

    def _view(self, watched: _Watched) -> PrefixResidency:
        return PrefixResidency(
            watched.prefix_hash,
            watched.state,
            watched.resident_tokens,
            self._tracked_tokens(watched),
            max(self._block_size.values(), default=0),
        )
