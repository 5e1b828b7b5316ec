"""WarmExecutor over a fake EnginePort: what counts as verified, and what a failure says."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from warmer.core.errors import EngineUnavailable
from warmer.core.model import (
    BoxCapacity,
    BoxSpec,
    CacheLayout,
    CacheStats,
    CompletionReport,
    EngineKind,
    ModelProfile,
    Prefix,
)
from warmer.service.engine_work.warming import WarmExecutor

BOX = BoxSpec(id="b", base_url="http://b:1", engine=EngineKind.SGLANG, model="m")
DENSE = ModelProfile(name="m", engine=EngineKind.SGLANG)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        self.t += 0.5
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


class FakeEngine:
    """Answers warm requests (no suffix) with `warm` and probes (a suffix) with `probe`."""

    def __init__(self, warm: CompletionReport, probe: CompletionReport | Exception) -> None:
        self.warm, self.probe = warm, probe
        self.suffixes: list[str] = []

    async def complete_prefix(
        self, box: BoxSpec, prefix: Prefix, *, suffix: str = "", max_tokens: int = 1, slot: int | None = None
    ) -> CompletionReport:
        self.suffixes.append(suffix)
        if not suffix:
            return self.warm
        if isinstance(self.probe, Exception):
            raise self.probe
        return self.probe

    async def health(self, box: BoxSpec) -> bool:
        return True

    async def epoch(self, box: BoxSpec) -> str:
        return "e"

    async def complete_prompt(
        self,
        box: BoxSpec,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        json_schema: dict[str, object] | None = None,
    ) -> CompletionReport:
        raise NotImplementedError

    async def render_chat(
        self, box: BoxSpec, messages: Sequence[dict[str, object]], tools: Sequence[dict[str, object]]
    ) -> str:
        raise NotImplementedError

    async def tokenize(self, box: BoxSpec, text: str) -> list[int]:
        raise NotImplementedError

    async def cache_layout(self, box: BoxSpec) -> CacheLayout:
        return CacheLayout()

    async def cache_stats(self, box: BoxSpec) -> CacheStats:
        raise NotImplementedError

    async def capacity(self, box: BoxSpec) -> BoxCapacity:
        return BoxCapacity(source="fake")


IDS = Prefix("p", 100, token_ids=tuple(range(100)))


def report(prompt: int, cached: int) -> CompletionReport:
    return CompletionReport(prompt_tokens=prompt, cached_tokens=cached, wall_seconds=0.1)


def test_the_engines_own_prefix_count_raises_an_understated_bar() -> None:
    # The spec says 100 tokens, but the engine counted 300 for the prefix alone: 150 cached is not enough.
    engine = FakeEngine(warm=report(300, 0), probe=report(310, 150))
    outcome = asyncio.run(WarmExecutor(engine, FakeClock()).warm_and_verify(BOX, DENSE, Prefix("p", 100)))
    assert not outcome.verified
    assert outcome.prefix_tokens == 300
    assert outcome.reason is not None
    assert "150 cached of 300" in outcome.reason
    assert outcome.wall_seconds == 0.5


def test_probe_suffixes_are_unique_per_probe() -> None:
    engine = FakeEngine(warm=report(100, 0), probe=report(110, 100))
    executor = WarmExecutor(engine, FakeClock())
    for _ in range(3):
        assert asyncio.run(executor.warm_and_verify(BOX, DENSE, Prefix("p", 100))).verified
    probes = [s for s in engine.suffixes if s]
    assert len(probes) == 3
    assert len(set(probes)) == 3


def test_a_probe_that_misses_right_after_an_answered_warm_is_contested() -> None:
    """The engine took the warm and the probe, and believably reports the prefix gone in between: the slot
    was used by something else. Engine errors, unbelievable counts and running-state misses are not."""
    missed = FakeEngine(warm=report(100, 0), probe=report(110, 4))
    outcome = asyncio.run(WarmExecutor(missed, FakeClock()).warm_and_verify(BOX, DENSE, IDS))
    assert (outcome.verified, outcome.contested, outcome.cached_tokens) == (False, True, 4)
    broken = FakeEngine(warm=report(100, 0), probe=EngineUnavailable("b", "HTTP 503"))
    assert not asyncio.run(WarmExecutor(broken, FakeClock()).warm_and_verify(BOX, DENSE, IDS)).contested
    lying = FakeEngine(warm=report(100, 0), probe=report(10_001, 10_000))
    assert not asyncio.run(WarmExecutor(lying, FakeClock()).warm_and_verify(BOX, DENSE, IDS)).contested
    hybrid = ModelProfile(name="m", engine=EngineKind.SGLANG, running_state=True, warm_requests_per_prefix=2)
    executor = WarmExecutor(missed, FakeClock(), max_rounds_running_state=2)
    assert not asyncio.run(executor.warm_and_verify(BOX, hybrid, IDS)).contested
    hit = FakeEngine(warm=report(100, 0), probe=report(110, 100))
    assert not asyncio.run(WarmExecutor(hit, FakeClock()).warm_and_verify(BOX, DENSE, IDS)).contested


def test_an_engine_failure_is_a_failed_outcome_naming_it() -> None:
    engine = FakeEngine(
        warm=report(100, 0), probe=EngineUnavailable("b", "POST /generate timed out after 60s")
    )
    outcome = asyncio.run(WarmExecutor(engine, FakeClock()).warm_and_verify(BOX, DENSE, Prefix("p", 100)))
    assert not outcome.verified
    assert outcome.cached_tokens is None
    assert outcome.requests_sent == 1
    assert outcome.reason == "engine error: b: POST /generate timed out after 60s"


def test_a_prefix_of_unknown_size_is_never_verified() -> None:
    hybrid = ModelProfile(name="m", engine=EngineKind.SGLANG, running_state=True, warm_requests_per_prefix=2)
    engine = FakeEngine(warm=report(0, 0), probe=report(50, 50))
    outcome = asyncio.run(
        WarmExecutor(engine, FakeClock(), max_rounds_running_state=2).probe(BOX, hybrid, Prefix("p", 0))
    )
    assert not outcome.verified
    assert outcome.reason is not None
    assert "unknown" in outcome.reason


def test_hit_granularity_prefers_the_server_page_then_the_profile() -> None:
    from warmer.core.model import CacheLayout, MambaStrategy
    from warmer.core.warmstate import hit_granularity

    dense = ModelProfile(name="m", engine=EngineKind.VLLM, block_tokens=16)
    assert hit_granularity(dense, CacheLayout()) == 16
    assert hit_granularity(dense, CacheLayout(page_tokens=128)) == 128
    # A Mamba strategy on a dense model changes nothing.
    assert hit_granularity(dense, CacheLayout(page_tokens=1, mamba_strategy=MambaStrategy.EXTRA_BUFFER)) == 1
    mamba = ModelProfile(name="h", engine=EngineKind.SGLANG, running_state=True, mamba_chunk_size=64)
    extra = MambaStrategy.EXTRA_BUFFER
    assert hit_granularity(mamba, CacheLayout(page_tokens=1, mamba_strategy=extra)) == 64
    assert hit_granularity(mamba, CacheLayout(page_tokens=256, mamba_strategy=extra)) == 256
    assert (
        hit_granularity(mamba, CacheLayout(page_tokens=16, mamba_strategy=extra, mamba_chunk_tokens=192))
        == 192
    )
    assert hit_granularity(mamba, CacheLayout(page_tokens=1, mamba_strategy=MambaStrategy.NO_BUFFER)) == 1


def test_hit_granularity_uses_the_profile_strategy_only_when_the_server_names_none() -> None:
    from warmer.core.model import CacheLayout, MambaStrategy
    from warmer.core.warmstate import hit_granularity

    extra = ModelProfile(
        name="h", engine=EngineKind.SGLANG, running_state=True, mamba_strategy=MambaStrategy.EXTRA_BUFFER
    )
    assert hit_granularity(extra, CacheLayout()) == 64
    assert hit_granularity(extra, CacheLayout(page_tokens=1, mamba_strategy=MambaStrategy.NO_BUFFER)) == 1


def test_a_keepalive_probe_claiming_more_cached_than_was_sent_is_not_verified() -> None:
    # 100 ids + the 16-byte probe suffix (at most 49 tokens) + 2 specials: 151 at most could be cached.
    engine = FakeEngine(warm=report(100, 0), probe=report(10_001, 10_000))
    outcome = asyncio.run(WarmExecutor(engine, FakeClock()).probe(BOX, DENSE, IDS))
    assert not outcome.verified
    assert outcome.reason == (
        "the engine's report contradicts what warmer sent:"
        " claims 10000 cached, more than the at most 151 tokens warmer sent"
    )


def test_a_contradicting_probe_ends_a_running_state_warm_at_once() -> None:
    hybrid = ModelProfile(name="m", engine=EngineKind.SGLANG, running_state=True, warm_requests_per_prefix=2)
    engine = FakeEngine(warm=report(100, 0), probe=report(10_001, 10_000))
    executor = WarmExecutor(engine, FakeClock(), max_rounds_running_state=4)
    outcome = asyncio.run(executor.warm_and_verify(BOX, hybrid, IDS))
    assert not outcome.verified
    assert (outcome.rounds, outcome.requests_sent) == (1, 2)
    assert outcome.reason is not None
    assert "claims 10000 cached" in outcome.reason
