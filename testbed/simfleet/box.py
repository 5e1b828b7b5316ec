"""One simulated engine box: its cache, its process identity, its prefill clock and slots, its counters.

A restart is what a real one is to warmer: the cache empties, the engine's counters start from zero, and
the identity the engine reports (llama.cpp's /props `media_marker`, vLLM's `process_start_time_seconds`,
SGLang's `random_seed` and `startup_time`) is drawn anew; optionally the box answers 503 for a while first,
as a loading server does. Requests running across a restart fail (their connection would have dropped).

Prefill is paced by one clock per box: uncached prompt tokens / `prefill_tokens_per_second`, requests in
the box's slots sharing that rate (each waits for the ones admitted before it), at most `slots` at a time.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from testbed.simfleet.cache import Lookup, PrefixCache


class SimEngine(StrEnum):
    LLAMACPP = "llamacpp"
    VLLM = "vllm"
    SGLANG = "sglang"


class HealthMode(StrEnum):
    OK = "ok"
    SLOW = "slow"  # /health answers after `health_delay_seconds`
    FAIL = "fail"  # /health answers 503


@dataclass(frozen=True)
class BoxConfig:
    """What every box of one sim process is: engine kind, cache size, speed and slots."""

    engine: SimEngine = SimEngine.LLAMACPP
    model: str = "tiny-demo"
    slots: int = 2
    context_tokens: int = 4096  # per slot (llama.cpp's n_ctx) / the max model length
    cache_tokens: int = 8192
    block_tokens: int = 1  # the hit granularity: vLLM's block_size, SGLang's page_size
    prefill_tokens_per_second: float = 20_000.0
    decode_seconds_per_token: float = 0.0005

    def __post_init__(self) -> None:
        if self.slots < 1 or self.context_tokens < 1 or self.cache_tokens < 1 or self.block_tokens < 1:
            raise ValueError("slots, context_tokens, cache_tokens and block_tokens must be >= 1")
        if self.prefill_tokens_per_second <= 0 or self.decode_seconds_per_token < 0:
            raise ValueError("prefill_tokens_per_second must be > 0 and decode_seconds_per_token >= 0")


class BoxRestarted(RuntimeError):
    """The box restarted while the request ran: no answer comes back."""


@dataclass
class Identity:
    """What the engine reports about its process; drawn anew on every (re)start."""

    started_at: float
    marker: str
    seed: int
    startup: dict[str, float]

    @classmethod
    def draw(cls) -> Identity:
        rng = random.SystemRandom()
        return cls(
            started_at=time.time(),
            marker=secrets.token_hex(8),
            seed=rng.randrange(1, 2**30),
            startup={
                "load_weight": round(rng.uniform(1, 60), 4),
                "kv_cache_allocation": round(rng.random(), 4),
            },
        )


# Route classes the counters tell apart: control traffic (health, identity, metrics, info), work (completions
# that prefill), and tokenizing helpers.
WORK_ROUTES = frozenset({"/completion", "/v1/completions", "/v1/chat/completions", "/generate"})
TOKENIZE_ROUTES = frozenset({"/tokenize", "/detokenize", "/apply-template"})


def route_class(path: str) -> str:
    if path in WORK_ROUTES:
        return "work"
    if path in TOKENIZE_ROUTES:
        return "tokenize"
    return "control"


@dataclass
class EngineCounters:
    """The engine's own cumulative counters (its /metrics); they restart from zero with the process."""

    processed_tokens: int = 0  # prompt tokens computed (not cached)
    cached_tokens: int = 0
    requests: int = 0
    decodes: int = 0
    generated_tokens: int = 0


@dataclass
class SimBox:
    index: int
    box_id: str
    config: BoxConfig
    cache: PrefixCache = field(init=False)
    identity: Identity = field(default_factory=Identity.draw)
    counters: EngineCounters = field(default_factory=EngineCounters)
    routes: Counter[str] = field(default_factory=Counter)  # "GET /health" -> requests, never reset
    restarts: int = 0
    health: HealthMode = HealthMode.OK
    health_delay_seconds: float = 0.0
    down_until: float = 0.0  # monotonic: until then every engine route answers 503 (loading)
    running: int = 0
    running_tokens: int = 0  # prompt + output tokens of the requests running now (their KV in the pool)
    _busy_until: float = 0.0
    _slots: asyncio.Semaphore | None = None
    # llama.cpp: the slot each request ran in, by when it was last used (an `id_slot` request runs in the slot
    # it names; one without takes the least recently used). The cache itself stays an LRU of `slots` prompts.
    _slot_used: dict[int, int] = field(default_factory=dict)
    _slot_clock: int = 0

    def __post_init__(self) -> None:
        self.cache = self._new_cache()

    def slot_for(self, requested: object) -> int:
        """The slot a llama-server request runs in, as its answer's `id_slot` says: the one it names (a slot
        of this box), else the least recently used one."""
        slots = self.config.slots
        if isinstance(requested, int) and not isinstance(requested, bool) and 0 <= requested < slots:
            slot = requested
        else:
            slot = min(range(slots), key=lambda s: self._slot_used.get(s, -1))
        self._slot_clock += 1
        self._slot_used[slot] = self._slot_clock
        return slot

    def _new_cache(self) -> PrefixCache:
        per_slot = self.config.slots if self.config.engine is SimEngine.LLAMACPP else None
        return PrefixCache(
            self.config.cache_tokens, block_tokens=self.config.block_tokens, max_sequences=per_slot
        )

    def count(self, method: str, path: str) -> None:
        self.routes[f"{method} {path}"] += 1

    def class_counts(self) -> dict[str, int]:
        classes: Counter[str] = Counter()
        for route, n in self.routes.items():
            classes[route_class(route.split(" ", 1)[1])] += n
        return {name: classes.get(name, 0) for name in ("control", "work", "tokenize")}

    def is_down(self) -> bool:
        return time.monotonic() < self.down_until

    def restart(self, *, down_seconds: float = 0.0) -> None:
        """A new process: empty cache, counters from zero, a new identity; 503 for `down_seconds`."""
        self.cache = self._new_cache()
        self.identity = Identity.draw()
        self.counters = EngineCounters()
        self.restarts += 1
        self.running = 0
        self.running_tokens = 0
        self._busy_until = 0.0
        self._slots = None
        self._slot_used = {}
        self.down_until = time.monotonic() + max(0.0, down_seconds)

    def used_share(self) -> float:
        """The share of the KV pool running requests hold (what vLLM's and SGLang's usage gauges report:
        cached tokens no request holds count as free)."""
        return min(1.0, self.running_tokens / self.config.cache_tokens)

    async def run(self, tokens: Sequence[int], max_tokens: int) -> tuple[Lookup, float, float]:
        """One completion: (its cache lookup, prefill seconds, decode seconds), after waiting them out."""
        identity = self.identity
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.config.slots)
        async with self._slots:
            if self.identity is not identity:
                raise BoxRestarted(self.box_id)
            held = len(tokens) + max(0, max_tokens)
            self.running += 1
            self.running_tokens += held
            try:
                lookup = self.cache.serve(tokens)
                uncached = lookup.prompt_tokens - lookup.cached_tokens
                prefill = uncached / self.config.prefill_tokens_per_second
                now = time.monotonic()
                self._busy_until = max(now, self._busy_until) + prefill
                decode = max(0, max_tokens) * self.config.decode_seconds_per_token
                await asyncio.sleep(self._busy_until - now + decode)
            finally:
                if self.identity is identity:
                    self.running -= 1
                    self.running_tokens -= held
        if self.identity is not identity:
            raise BoxRestarted(self.box_id)
        self.counters.processed_tokens += uncached
        self.counters.cached_tokens += lookup.cached_tokens
        self.counters.requests += 1
        self.counters.decodes += 1 + max(0, max_tokens)
        self.counters.generated_tokens += max(0, max_tokens)
        return lookup, prefill, decode

    def state(self) -> dict[str, object]:
        return {
            "id": self.box_id,
            "index": self.index,
            "engine": self.config.engine.value,
            "restarts": self.restarts,
            "epoch": self.identity.marker,
            "health": self.health.value,
            "down": self.is_down(),
            "running": self.running,
            "cache": {
                "held_tokens": self.cache.held_tokens,
                "capacity_tokens": self.cache.capacity_tokens,
                "sequences": self.cache.sequences(),
                "evicted_sequences": self.cache.evicted_sequences,
            },
            "requests": {**self.class_counts(), "routes": dict(self.routes)},
        }
