"""The vLLM adapter's capacity on a real vLLM CPU server whose pool binds: the KV pool is the block count
the server was started with times the block size it reports, and the share live requests hold rises under a
live request and falls back once it ends, although its blocks stay cached (cached blocks no request holds
count as free: vllm/v1/core/block_pool.py `free_blocks` / `get_usage`).

The module runs its own small server (`--num-gpu-blocks-override`), so the session's server keeps its
roomy cache for the other tests.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from testbed.vllm_server import VllmServer
from warmer.adapters.engines.vllm import VllmEngine
from warmer.core.capacity import prefix_budget_tokens
from warmer.core.model import BoxCapacity, BoxSpec, EngineKind, EngineTimeouts

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

GPU_BLOCKS = 24  # x 128 = 3,072 tokens: one 2,048-token request fits, the pool binds
# Byte-level tokenizer: ~10 of the 23 usable blocks (0.43) from its first step, ~16 (0.70) by its last. It
# runs long enough to be seen: CI once read five 0.0s through a 1,500-token prompt with 400 generated
# (the whole request came and went between readings on a quiet machine).
PROMPT_BYTES = 1200
GENERATED = 800  # prompt + generated stay under the server's 2,048-token context
WAIT_S = 120.0  # a loaded 2-core machine: a bound, not an expectation


@pytest.fixture(scope="module")
def small_pool(tiny_hf_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    server = VllmServer(
        tiny_hf_model_path,
        workdir=tmp_path_factory.mktemp("vllm-capacity"),
        extra_args=("--num-gpu-blocks-override", str(GPU_BLOCKS)),
    )
    with server:
        yield server


def unique_text() -> str:
    rng = random.Random(uuid.uuid4().int)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(PROMPT_BYTES))


def test_pool_is_the_overridden_block_count_times_the_block_size_and_the_used_share_follows_a_live_request(
    small_pool: VllmServer,
) -> None:
    box = BoxSpec(id="vllm-cap", base_url=small_pool.base_url, engine=EngineKind.VLLM, model="tiny-vllm-cpu")

    async def scenario() -> tuple[BoxCapacity, int | None, list[float], BoxCapacity]:
        async with httpx.AsyncClient() as client:
            engine = VllmEngine(client, timeouts=EngineTimeouts(request=WAIT_S))
            idle = await engine.capacity(box)
            block = (await engine.cache_layout(box)).page_tokens
            body = {
                "model": small_pool.served_model_name,
                "prompt": unique_text(),
                "max_tokens": GENERATED,
                "temperature": 0.0,
                "ignore_eos": True,  # vLLM SamplingParams: run all GENERATED steps
            }
            call = asyncio.create_task(
                client.post(f"{box.base_url}/v1/completions", json=body, timeout=WAIT_S)
            )
            seen: list[float] = []
            while not call.done():
                reading = await engine.capacity(box)
                if reading.used_share is not None:
                    seen.append(reading.used_share)
                await asyncio.sleep(0.02)
            (await call).raise_for_status()
            after = await engine.capacity(box)
            deadline = time.monotonic() + 30.0
            while (after.used_share or 0.0) > 0.0 and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                after = await engine.capacity(box)
            return idle, block, seen, after

    idle, block, seen, after = asyncio.run(scenario())
    assert block is not None
    assert idle.pool_tokens == GPU_BLOCKS * block
    assert idle.used_share == 0.0
    assert idle.tokens == prefix_budget_tokens(GPU_BLOCKS * block, 0.0)
    # ~10 prompt blocks, then one more per 128 generated, of 23 usable (block 0 is the null block)
    assert max(seen) > 0.35, seen
    assert after.used_share == 0.0  # its blocks are cached now, and cached blocks no request holds are free
    assert after.tokens == idle.tokens
