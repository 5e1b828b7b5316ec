"""A real hybrid model on vLLM CPU (0.32, `mamba_cache_mode` "align"): one Gated DeltaNet linear-attention
layer (a running state) and one full-attention layer, tiny and random (testbed/tiny_hybrid_model.py).

What it shows, measured here rather than pinned by fixtures:
- the warm-verification rule: the first request of a prefix computes it (0 cached), and the very next one
  hits, on the 128-token block grid (an 800-token prefix reads 768 cached): one warm and one probe verify
  it; suffixed requests after it hit the same 768. vLLM stores the running state at block boundaries
  ("align"), so unlike SGLang's `no_buffer` no second, diverging request is needed;
- the KV cache events of a hybrid: the linear-attention group (`kv_cache_spec_kind` "mamba", group 0)
  announces one block hash for the whole 768-token run (its null blocks skipped,
  `BlockPool.cache_full_blocks`) while the full-attention group announces all six: warmer's residency takes
  both, and the prefix reads resident only with the running state's group holding the block at its end.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from testbed.tiny_hybrid_model import ensure_tiny_hybrid_model
from testbed.vllm_server import CPU_BLOCK_SIZE, VllmServer, free_port, kv_events_args
from warmer.adapters.engines.vllm import VllmEngine
from warmer.adapters.engines.vllm_kv_events import ZmqKvEventSource
from warmer.core.kv_event_stream import BlockStored
from warmer.core.model import BoxSpec, EngineKind, EngineTimeouts, KvEventsEndpoint, ModelProfile, Prefix
from warmer.core.residency import PrefixState
from warmer.root.engines import SystemClock
from warmer.service.engine_signals.cache_events import CacheEventWatcher, ResetReason
from warmer.service.engine_work.warming import WarmExecutor, WarmOutcome

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

PROFILE = ModelProfile(
    name="tiny-hybrid-vllm-cpu", engine=EngineKind.VLLM, running_state=True, block_tokens=CPU_BLOCK_SIZE
)
PREFIX_BYTES = 800  # one token per byte: 6 full blocks of 128 and a partial one


@pytest.fixture(scope="module")
def hybrid_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BoxSpec]:
    pub, replay = free_port(), free_port()
    server = VllmServer(
        ensure_tiny_hybrid_model(),
        workdir=tmp_path_factory.mktemp("vllm-hybrid"),
        extra_args=kv_events_args(pub, replay),
    )
    with server:
        yield BoxSpec(
            id="vllm-hybrid",
            base_url=server.base_url,
            engine=EngineKind.VLLM,
            model=PROFILE.name,
            kv_events=KvEventsEndpoint(f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}"),
        )


def unique_prefix_text() -> str:
    head = f"Agent {uuid.uuid4().hex}: you are a helpful voice agent for Acme. "
    return (head * (PREFIX_BYTES // len(head) + 1))[:PREFIX_BYTES]


async def token_prefix(engine: VllmEngine, box: BoxSpec) -> Prefix:
    text = unique_prefix_text()
    ids = await engine.tokenize(box, text)
    return Prefix(text=text, token_count=len(ids), token_ids=tuple(ids))


def test_a_hybrid_prefix_is_verified_by_one_warm_and_one_probe_on_the_block_grid(hybrid_box: BoxSpec) -> None:
    async def scenario() -> tuple[WarmOutcome, list[int]]:
        async with httpx.AsyncClient() as client:
            engine = VllmEngine(client, timeouts=EngineTimeouts(request=120.0))
            prefix = await token_prefix(engine, hybrid_box)
            outcome = await WarmExecutor(engine, SystemClock()).warm_and_verify(hybrid_box, PROFILE, prefix)
            later = [
                (await engine.complete_prefix(hybrid_box, prefix, suffix=f" Caller {i}: hello")).cached_tokens
                for i in range(2)
            ]
            return outcome, later

    outcome, later = asyncio.run(scenario())
    assert outcome.verified, outcome.describe()
    assert (outcome.rounds, outcome.requests_sent) == (1, 2)
    assert outcome.block_tokens == CPU_BLOCK_SIZE
    assert outcome.cached_tokens == 768
    assert later == [768, 768]


class _Resets:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def prefix_evicted(self, box_id: str, prefix_hash: str, resident_tokens: int) -> None:
        self.calls.append("evicted")

    def prefix_resident(self, box_id: str, prefix_hash: str) -> None:
        self.calls.append("resident")

    def box_reset(self, box_id: str, reason: ResetReason) -> None:
        self.calls.append(f"reset:{reason.value}")


def test_a_hybrids_running_state_group_skips_null_blocks_and_the_prefix_reads_resident(
    hybrid_box: BoxSpec,
) -> None:
    async def scenario() -> tuple[list[BlockStored], object]:
        source = ZmqKvEventSource(replay_timeout_s=10.0)
        async with httpx.AsyncClient() as client:
            engine = VllmEngine(client, timeouts=EngineTimeouts(request=120.0))
            listener = _Resets()
            watcher = CacheEventWatcher(
                port=source,
                listener=listener,
                fleet=lambda: [hybrid_box],
                tokenize=engine.tokenize,
                clock=SystemClock(),
            )
            watcher.sync_boxes([hybrid_box])
            try:
                prefix = await token_prefix(engine, hybrid_box)
                assert prefix.token_ids is not None
                await engine.complete_prefix(hybrid_box, prefix)
                await watcher.watch(hybrid_box, prefix)
                deadline = time.monotonic() + 60
                while (view := watcher.state(hybrid_box.id, prefix.hash)) is None or (
                    view.state is not PrefixState.RESIDENT
                ):
                    assert time.monotonic() < deadline, f"never resident: {view}"
                    await asyncio.sleep(0.2)
                stream = source.subscribe(hybrid_box)
                try:
                    stored = [
                        event
                        for batch in await stream.replay(0)
                        for event in batch.events
                        if isinstance(event, BlockStored)
                        and event.parent_hash is None
                        and tuple(event.token_ids) == prefix.token_ids[: len(event.token_ids)]
                    ]
                finally:
                    await stream.aclose()
                return stored, view
            finally:
                await watcher.close()
                source.close()

    stored, view = asyncio.run(scenario())
    by_group = {event.group: event for event in stored}
    assert set(by_group) == {0, 1}
    running_state, attention = by_group[0], by_group[1]
    assert running_state.sparse  # kv_cache_spec_kind "mamba"
    assert (len(running_state.block_hashes), len(running_state.token_ids)) == (1, 768)  # null blocks skipped
    assert not attention.sparse
    assert (len(attention.block_hashes), len(attention.token_ids)) == (6, 768)
    assert running_state.block_hashes[0] == attention.block_hashes[-1]  # the request's own hashes
    assert (getattr(view, "resident_tokens", None), getattr(view, "tracked_tokens", None)) == (768, 768)
