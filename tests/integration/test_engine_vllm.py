"""The vLLM adapter and the warm executor against a real vLLM CPU server (block size 128).

The session shares one server, so every test uses prompts that start with its own unique words: nothing
another test cached can make a hit here.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx
import pytest

from testbed.vllm_server import CPU_BLOCK_SIZE, VllmServer
from warmer.adapters.engines.restart_watch import RestartWatch
from warmer.adapters.engines.vllm import VllmEngine
from warmer.core.model import BoxSpec, EngineKind, EngineTimeouts, ModelProfile, Prefix
from warmer.root.engines import SystemClock
from warmer.service.engine_work.warming import WarmExecutor, WarmOutcome

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

T = TypeVar("T")
PROFILE = ModelProfile(name="tiny-vllm-cpu", engine=EngineKind.VLLM, block_tokens=CPU_BLOCK_SIZE)


def unique_prefix_text() -> str:
    tag = uuid.uuid4().hex
    return f"Session {tag}. " + "".join(f"Rule {i}: greet, verify identity, then book. " for i in range(14))


def spec(server: VllmServer) -> BoxSpec:
    return BoxSpec(id="vllm-0", base_url=server.base_url, engine=EngineKind.VLLM, model="tiny-vllm-cpu")


def with_engine(action: Callable[[VllmEngine], Awaitable[T]], watch: RestartWatch) -> T:
    async def go() -> T:
        async with httpx.AsyncClient() as client:
            return await action(VllmEngine(client, timeouts=EngineTimeouts(request=120.0), watch=watch))

    return asyncio.run(go())


async def token_prefix(engine: VllmEngine, box: BoxSpec, text: str) -> Prefix:
    ids = await engine.tokenize(box, text)
    return Prefix(text=text, token_count=len(ids), token_ids=tuple(ids))


def test_warm_then_probe_hits_in_whole_blocks_and_a_changed_first_character_misses(
    vllm_server: VllmServer,
) -> None:
    box = spec(vllm_server)
    text = unique_prefix_text()

    async def scenario(engine: VllmEngine) -> tuple[WarmOutcome, WarmOutcome, WarmOutcome]:
        assert await engine.health(box)
        executor = WarmExecutor(engine, SystemClock())
        prefix = await token_prefix(engine, box, text)
        warmed = await executor.warm_and_verify(box, PROFILE, prefix)
        changed = await token_prefix(engine, box, "X" + text[1:])
        missed = await executor.probe(box, PROFILE, changed)
        as_text = await executor.warm_and_verify(
            box, PROFILE, Prefix(text=text, token_count=prefix.token_count)
        )
        return warmed, missed, as_text

    warmed, missed, as_text = with_engine(scenario, RestartWatch())
    assert warmed.verified, warmed.describe()
    assert warmed.prefix_tokens > 3 * CPU_BLOCK_SIZE
    assert warmed.cached_tokens is not None
    assert warmed.cached_tokens % CPU_BLOCK_SIZE == 0
    assert warmed.cached_tokens >= warmed.prefix_tokens - CPU_BLOCK_SIZE
    assert not missed.verified
    assert missed.cached_tokens == 0  # the first block differs, so no block matches
    assert as_text.verified, as_text.describe()


def test_restart_changes_the_epoch_and_the_probe_shows_cold(vllm_restartable: VllmServer) -> None:
    box = spec(vllm_restartable)
    watch = RestartWatch()
    text = unique_prefix_text()

    async def before(engine: VllmEngine) -> tuple[str, WarmOutcome, Prefix]:
        prefix = await token_prefix(engine, box, text)
        warmed = await WarmExecutor(engine, SystemClock()).warm_and_verify(box, PROFILE, prefix)
        return await engine.epoch(box), warmed, prefix

    epoch_before, warmed, prefix = with_engine(before, watch)
    assert warmed.verified, warmed.describe()
    assert with_engine(lambda engine: engine.epoch(box), watch) == epoch_before

    vllm_restartable.restart()

    async def after(engine: VllmEngine) -> tuple[str, WarmOutcome]:
        epoch = await engine.epoch(box)
        return epoch, await WarmExecutor(engine, SystemClock()).probe(box, PROFILE, prefix)

    # A fresh watch: the adapter did not see the box go down, so the epoch must come from the engine.
    epoch_after, cold = with_engine(after, RestartWatch())
    assert epoch_after.startswith("vllm-start-")
    assert epoch_after != epoch_before
    assert not cold.verified
    assert cold.cached_tokens == 0


def test_the_block_size_comes_from_the_server_not_the_profile(vllm_server: VllmServer) -> None:
    """The real server publishes vllm:cache_config_info{block_size="128"}; a profile whose fallback says 1
    still verifies, because the tolerance is the server's block."""
    box = spec(vllm_server)
    wrong_fallback = ModelProfile(name="tiny-vllm-cpu", engine=EngineKind.VLLM, block_tokens=1)

    async def scenario(engine: VllmEngine) -> tuple[int | None, WarmOutcome]:
        layout = await engine.cache_layout(box)
        prefix = await token_prefix(engine, box, unique_prefix_text())
        return layout.page_tokens, await WarmExecutor(engine, SystemClock()).warm_and_verify(
            box, wrong_fallback, prefix
        )

    page, outcome = with_engine(scenario, RestartWatch())
    assert page == CPU_BLOCK_SIZE
    assert outcome.verified, outcome.describe()
    assert (outcome.block_tokens, outcome.block_source) == (
        CPU_BLOCK_SIZE,
        "vllm /metrics vllm:cache_config_info",
    )
