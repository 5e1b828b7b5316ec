"""A fake engine prefix cache that emits KV cache events as vLLM does, for residency and watcher tests.

As `vllm/v1/core/block_pool.py` builds them (`cache_full_blocks` / `_maybe_evict_cached_block`): one
`BlockStored` per run of newly full blocks of one request, its `parent_block_hash` the hash of the block
before the run (None from the start), `token_ids` the run's tokens; one `BlockRemoved` per evicted block.
Hashes chain over the parent hash and the block's tokens from a per-process seed, as vLLM's do
(`vllm/v1/core/kv_cache_utils.py`, `hash_block_tokens`, `NONE_HASH`); the hash function is the fake's own,
only the chaining matters to warmer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from warmer.core.residency import BlockHash, BlockRemoved, BlockStored

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
