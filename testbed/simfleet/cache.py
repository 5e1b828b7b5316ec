"""One simulated box's prefix cache: an LRU of token sequences, sized in tokens, matched from the first token.

A request's hit is its longest common prefix with any sequence the cache holds (what llama.cpp's slot reuse
and vLLM's/SGLang's prefix trees report for one prompt), capped one token short of the prompt (every engine
computes at least the last prompt token) and rounded down to the engine's block. After the request its whole
prompt is held as the most recently used sequence; a held sequence the new one extends is replaced by it.
Each sequence is charged its full length (a tree would store a shared stem once: the simulation evicts a
little earlier than a radix cache would, never later). Sequences are `array("I")` so thousands of boxes
holding long prompts stay small, and prefix comparison runs on slices, in C.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count

_CHUNK = 256


def common_prefix_len(a: array[int], b: array[int]) -> int:
    """How many leading tokens `a` and `b` share: equal 256-token slices skipped at C speed, then token by
    token inside the first slice that differs."""
    limit = min(len(a), len(b))
    start = 0
    while start + _CHUNK <= limit and a[start : start + _CHUNK] == b[start : start + _CHUNK]:
        start += _CHUNK
    while start < limit and a[start] == b[start]:
        start += 1
    return start


@dataclass(frozen=True)
class Lookup:
    """What a request meets in the cache: tokens reused (block-rounded), of `prompt_tokens`."""

    cached_tokens: int
    prompt_tokens: int


class PrefixCache:
    """LRU of token sequences whose lengths sum to at most `capacity_tokens` (and at most `max_sequences`,
    llama.cpp's one prompt per slot). `block_tokens` is the engine's hit granularity (vLLM's block)."""

    def __init__(
        self, capacity_tokens: int, *, block_tokens: int = 1, max_sequences: int | None = None
    ) -> None:
        if capacity_tokens < 1 or block_tokens < 1:
            raise ValueError("capacity_tokens and block_tokens must be >= 1")
        if max_sequences is not None and max_sequences < 1:
            raise ValueError("max_sequences must be >= 1")
        self.capacity_tokens = capacity_tokens
        self.block_tokens = block_tokens
        self.max_sequences = max_sequences
        self._held: OrderedDict[int, array[int]] = OrderedDict()  # key -> tokens, least recent first
        self._keys = count()
        self.held_tokens = 0
        self.evicted_sequences = 0

    def __len__(self) -> int:
        return len(self._held)

    def sequences(self) -> list[int]:
        """Lengths of the held sequences, least recently used first."""
        return [len(tokens) for tokens in self._held.values()]

    def _best(self, tokens: array[int]) -> tuple[int | None, int]:
        best_key, best = None, 0
        for key, held in self._held.items():
            shared = common_prefix_len(held, tokens)
            if shared > best:
                best_key, best = key, shared
        return best_key, best

    def peek(self, tokens: Sequence[int]) -> int:
        """Leading tokens of `tokens` held, without touching recency or the block rounding."""
        return self._best(array("I", tokens))[1]

    def serve(self, tokens: Sequence[int]) -> Lookup:
        """Run one prompt through the cache: its hit, then the prompt held as most recently used."""
        prompt = array("I", tokens)
        key, shared = self._best(prompt)
        cached = min(shared, max(0, len(prompt) - 1)) // self.block_tokens * self.block_tokens
        if key is not None:
            held = self._held[key]
            if len(held) == shared:  # the new prompt extends it (or repeats it): hold the longer one
                self._drop(key)
            elif shared == len(prompt):  # the prompt is a prefix of what is held: refresh that
                self._held.move_to_end(key)
                return Lookup(cached, len(prompt))
        self._hold(prompt)
        return Lookup(cached, len(prompt))

    def _drop(self, key: int) -> None:
        self.held_tokens -= len(self._held.pop(key))

    def _hold(self, prompt: array[int]) -> None:
        if len(prompt) > self.capacity_tokens:
            return  # longer than the whole cache: computed, never held
        self._held[next(self._keys)] = prompt
        self.held_tokens += len(prompt)
        while self.held_tokens > self.capacity_tokens or (
            self.max_sequences is not None and len(self._held) > self.max_sequences
        ):
            self._drop(next(iter(self._held)))
            self.evicted_sequences += 1

    def clear(self) -> None:
        self._held.clear()
        self.held_tokens = 0
