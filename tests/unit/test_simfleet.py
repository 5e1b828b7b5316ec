"""The simulated fleet (testbed/simfleet): its prefix cache, and its answers read by warmer's real adapters
and compared, key by key and type by type, with the engine bodies recorded in tests/unit/engine_shapes.py.
Boxes live under a path prefix (`/box/{index}`), so every adapter call here also exercises a base URL with
a path."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from testbed.simfleet import BoxConfig, PrefixCache, SimEngine, SimFleetApp, simfleet_in_process
from tests.unit.engine_shapes import (
    FAST_RETRY,
    LLAMACPP_METRICS,
    SGLANG_METRICS,
    SHORT_TIMEOUTS,
    VLLM_METRICS,
    llamacpp_completion,
    openai_completion,
    sglang_generate,
    sglang_server_info,
)
from warmer.adapters.engines.llamacpp import LlamaCppEngine
from warmer.adapters.engines.sglang import SglangEngine
from warmer.adapters.engines.vllm import VllmEngine
from warmer.core.errors import EngineDown, EngineSlow
from warmer.core.model import BoxSpec, EngineKind, Prefix
from warmer.core.promtext import parse_prometheus_text
from warmer.core.warmstate import is_verified

BASE = "http://sim.test:9"
ADAPTERS = {
    SimEngine.LLAMACPP: (LlamaCppEngine, EngineKind.LLAMACPP),
    SimEngine.VLLM: (VllmEngine, EngineKind.VLLM),
    SimEngine.SGLANG: (SglangEngine, EngineKind.SGLANG),
}
PREFIX = "You are Ada, the clinic's receptionist. Be brief and kind. " * 8

# -- the cache ----------------------------------------------------------------------------------------


def test_hit_is_the_longest_exact_prefix_from_the_first_token_minus_the_last_token() -> None:
    cache = PrefixCache(1000)
    assert cache.serve([1, 2, 3, 4, 5]).cached_tokens == 0
    assert cache.serve([1, 2, 3, 4, 5, 6, 7]).cached_tokens == 5  # extends what is held
    assert cache.serve([1, 2, 3, 4, 5, 6, 7]).cached_tokens == 6  # a repeat: the last token is computed
    assert cache.serve([9, 2, 3, 4, 5, 6, 7]).cached_tokens == 0  # differs at the first token: no hit
    assert cache.serve([1, 2, 9]).cached_tokens == 2
    assert cache.sequences() == [7, 7, 3]  # the extended sequence replaced its prefix


def test_lru_eviction_in_tokens_and_block_rounding() -> None:
    cache = PrefixCache(10, block_tokens=4)
    a, b, c = [1] * 4 + [2] * 2, [3] * 4, [5] * 3
    cache.serve(a)  # 6 tokens
    cache.serve(b)  # 10 held
    assert cache.serve(a).cached_tokens == 4  # 5 shared (last token computed), rounded down to the block
    cache.serve(c)  # 13 > 10: the least recently used (b) goes
    assert cache.held_tokens == 9
    assert cache.evicted_sequences == 1
    assert cache.peek(b) == 0
    assert cache.peek(a) == 6
    cache.serve(list(range(100, 111)))  # longer than the whole cache: computed, never held
    assert cache.sequences() == [6, 3]


def test_max_sequences_bounds_prompts_held_like_llamacpp_slots() -> None:
    cache = PrefixCache(1000, max_sequences=2)
    for first in (1, 2, 3):
        cache.serve([first] * 5)
    assert cache.peek([1] * 5) == 0
    assert cache.peek([3] * 5) == 5
    assert len(cache) == 2


# -- the boxes through warmer's adapters ------------------------------------------------------------


@contextmanager
def sim(engine: SimEngine, **config: Any) -> Iterator[tuple[SimFleetApp, httpx.AsyncClient]]:
    app = SimFleetApp(BoxConfig(engine=engine, **config), count=3, base_url=BASE)
    yield app, httpx.AsyncClient(transport=httpx.ASGITransport(app=app))


def spec(engine: SimEngine, index: int = 1) -> BoxSpec:
    return BoxSpec(id=f"sim-{index}", base_url=f"{BASE}/box/{index}", engine=ADAPTERS[engine][1], model="m")


def adapter(engine: SimEngine, client: httpx.AsyncClient) -> Any:
    return ADAPTERS[engine][0](client, timeouts=SHORT_TIMEOUTS, retry=FAST_RETRY)


@pytest.mark.parametrize("engine", list(SimEngine))
def test_warm_verifies_and_a_restart_changes_the_epoch_empties_the_cache_and_resets_counters(
    engine: SimEngine,
) -> None:
    async def scenario() -> None:
        with sim(engine, block_tokens=16 if engine is SimEngine.VLLM else 1) as (app, client):
            port, box = adapter(engine, client), spec(engine)
            assert await port.health(box)
            epoch = await port.epoch(box)
            assert await port.epoch(box) == epoch
            prefix = Prefix(
                text=PREFIX, token_count=len(app.engine.tokenizer.encode(PREFIX, add_special=True))
            )
            cold = await port.complete_prefix(box, prefix)
            assert cold.cached_tokens == 0
            assert cold.prompt_tokens == prefix.token_count
            probe = await port.complete_prefix(box, prefix, suffix=" Hello?")
            block = 16 if engine is SimEngine.VLLM else 1
            assert is_verified(prefix.token_count, probe.cached_tokens, block)
            stats = await port.cache_stats(box)
            assert (stats.queried_tokens, stats.hit_tokens) == (
                cold.prompt_tokens + probe.prompt_tokens,
                probe.cached_tokens,
            )
            other = await port.complete_prefix(spec(engine, 2), prefix)  # boxes do not share caches
            assert other.cached_tokens == 0

            app.boxes[1].restart()
            assert await port.epoch(box) != epoch
            after = await port.complete_prefix(box, prefix, suffix=" Hello?")
            assert after.cached_tokens == 0
            stats = await port.cache_stats(box)
            assert stats.hit_tokens == 0
            assert stats.queried_tokens == after.prompt_tokens

    asyncio.run(scenario())


def test_a_llamacpp_request_runs_in_the_slot_it_names_and_the_answer_says_so() -> None:
    """warmer pins each prefix to a slot by the `id_slot` the answer reports, as llama-server reports the
    slot that ran it: a sim answering one slot for every request had every prefix of a box pinned to it."""

    async def scenario() -> None:
        with sim(SimEngine.LLAMACPP, slots=4) as (app, client):
            port, box = adapter(SimEngine.LLAMACPP, client), spec(SimEngine.LLAMACPP)
            prefix = Prefix(
                text=PREFIX, token_count=len(app.engine.tokenizer.encode(PREFIX, add_special=True))
            )
            named = [(await port.complete_prefix(box, prefix, slot=slot)).slot for slot in (2, 3, 2)]
            assert named == [2, 3, 2]
            # unnamed: the least recently used slot, never used ones first
            unnamed = [(await port.complete_prefix(box, prefix)).slot for _ in range(3)]
            assert unnamed == [0, 1, 3]

    asyncio.run(scenario())


@pytest.mark.parametrize("engine", list(SimEngine))
def test_failing_health_is_down_and_requests_are_counted_by_class(engine: SimEngine) -> None:
    async def scenario() -> None:
        with sim(engine) as (app, client):
            port, box = adapter(engine, client), spec(engine)
            await port.health(box)
            await port.complete_prefix(box, Prefix(text="hi there", token_count=3))
            reply = await client.post(f"{BASE}/_sim/health", json={"boxes": [1], "mode": "fail"})
            assert reply.status_code == 200
            with pytest.raises(EngineDown):
                await port.health(box)
            counts = app.stats()["boxes"]["sim-1"]
            assert counts["work"] == 1
            assert counts["control"] >= 2
            assert app.stats()["boxes"]["sim-0"] == {"control": 0, "work": 0, "tokenize": 0}
            bad = await client.post(f"{BASE}/_sim/restart", json={"boxes": [1, 99]})
            assert bad.status_code == 400
            assert app.boxes[1].restarts == 0

    asyncio.run(scenario())


def test_capacity_and_layout_come_from_the_configured_cache() -> None:
    async def scenario() -> None:
        with sim(SimEngine.VLLM, cache_tokens=4096, block_tokens=16) as (_, vllm_client):
            port, box = adapter(SimEngine.VLLM, vllm_client), spec(SimEngine.VLLM)
            assert (await port.capacity(box)).pool_tokens == 4096
            assert (await port.cache_layout(box)).page_tokens == 16
        with sim(SimEngine.SGLANG, cache_tokens=8192) as (_, sglang_client):
            port, box = adapter(SimEngine.SGLANG, sglang_client), spec(SimEngine.SGLANG)
            assert (await port.capacity(box)).pool_tokens == 8192
        with sim(SimEngine.LLAMACPP, slots=3) as (_, llama_client):
            port, box = adapter(SimEngine.LLAMACPP, llama_client), spec(SimEngine.LLAMACPP)
            assert (await port.capacity(box)).prefixes == 3

    asyncio.run(scenario())


# -- shapes against the recorded engine answers ------------------------------------------------------


def shape(value: Any) -> Any:
    """Keys and value types, recursively (ints and floats both count as numbers)."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, int | float) else type(value).__name__


def covers(actual: Any, recorded: Any, where: str = "") -> list[str]:
    """Where `actual` lacks a key of `recorded` or holds another type (extra keys are fine)."""
    if isinstance(recorded, dict):
        if not isinstance(actual, dict):
            return [f"{where}: {actual!r} is not an object"]
        return [
            m
            for key in recorded
            for m in covers(actual.get(key, "<missing>"), recorded[key], f"{where}.{key}")
        ]
    if isinstance(recorded, list):
        return [] if not recorded or not actual else covers(actual[0], recorded[0], f"{where}[0]")
    return [] if actual == recorded else [f"{where}: {actual} where the engine sends {recorded}"]


def sim_json(app: SimFleetApp, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    async def call() -> Any:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as client:
            response = await client.request(method, f"{BASE}/box/0{path}", json=body)
            assert response.status_code == 200, response.text
            return response.text if path == "/metrics" else response.json()

    return asyncio.run(call())


@pytest.mark.parametrize(
    ("engine", "path", "body", "recorded"),
    [
        (SimEngine.LLAMACPP, "/completion", {"prompt": PREFIX, "n_predict": 1}, llamacpp_completion(1, 2)),
        (SimEngine.LLAMACPP, "/v1/completions", {"prompt": PREFIX, "max_tokens": 1}, openai_completion(3, 1)),
        (SimEngine.VLLM, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 1},
         openai_completion(3, None)),
        (SimEngine.SGLANG, "/generate", {"text": PREFIX, "sampling_params": {"max_new_tokens": 1}},
         sglang_generate(3, 1)),
        (SimEngine.SGLANG, "/v1/completions", {"prompt": PREFIX, "max_tokens": 1}, openai_completion(3, 1)),
        (SimEngine.SGLANG, "/server_info", None, sglang_server_info()),
    ],
)  # fmt: skip
def test_answers_have_the_recorded_engine_shapes(
    engine: SimEngine, path: str, body: dict[str, Any] | None, recorded: dict[str, Any]
) -> None:
    app = SimFleetApp(BoxConfig(engine=engine), count=1, base_url=BASE)
    method = "GET" if body is None else "POST"
    assert covers(shape(sim_json(app, method, path, body)), shape(recorded)) == []
    if engine is SimEngine.VLLM:  # repeated: now with cached tokens, the details object vLLM then sends
        again = sim_json(app, method, path, {"prompt": [1, 2, 3, 4], "max_tokens": 1})
        assert covers(shape(again), shape(openai_completion(4, 3))) == []


@pytest.mark.parametrize(
    ("engine", "recorded"),
    [
        (SimEngine.LLAMACPP, LLAMACPP_METRICS),
        (SimEngine.VLLM, VLLM_METRICS),
        (SimEngine.SGLANG, SGLANG_METRICS),
    ],
)
def test_metrics_expose_the_recorded_families(engine: SimEngine, recorded: str) -> None:
    app = SimFleetApp(BoxConfig(engine=engine), count=1, base_url=BASE)
    ours = {sample.name for sample in parse_prometheus_text(sim_json(app, "GET", "/metrics"))}
    wanted = {sample.name for sample in parse_prometheus_text(recorded)} - {"sglang:cache_hit_rate"}
    assert wanted <= ours  # cache_hit_rate: a last-batch gauge warmer does not read


def test_lookup_and_fleet_control_routes() -> None:
    app = SimFleetApp(BoxConfig(), count=2, first=5, id_prefix="b", base_url="http://h:1")
    assert app.fleet()["boxes"] == [
        {"id": "b5", "base_url": "http://h:1/box/5"},
        {"id": "b6", "base_url": "http://h:1/box/6"},
    ]
    ids = app.engine.tokenizer.encode(PREFIX, add_special=True)
    one = SimFleetApp(BoxConfig(), count=1, base_url=BASE)
    sim_json(one, "POST", "/completion", {"prompt": ids, "n_predict": 1})
    box = one.boxes[0]
    assert box.cache.peek(ids) == len(ids)
    assert box.cache.peek(ids[1:]) == 0
    assert json.loads(json.dumps(box.state()))["cache"]["sequences"] == [len(ids)]


def test_slow_health_over_a_real_socket_is_slow_not_down_and_recovers() -> None:
    """Timeouts need a real socket (the ASGI transport has none): a slow /health is EngineSlow."""

    async def scenario() -> None:
        async with simfleet_in_process(2) as app, httpx.AsyncClient() as client:
            port = LlamaCppEngine(client, timeouts=SHORT_TIMEOUTS, retry=FAST_RETRY)
            box = BoxSpec(id="sim-1", base_url=app.box_url(1), engine=EngineKind.LLAMACPP, model="m")
            assert await port.health(box)
            slow = {"boxes": [1], "mode": "slow", "delay_seconds": 5 * SHORT_TIMEOUTS.health}
            assert (await client.post(f"{app.base_url}/_sim/health", json=slow)).status_code == 200
            with pytest.raises(EngineSlow):
                await port.health(box)
            await client.post(f"{app.base_url}/_sim/health", json={"boxes": [1], "mode": "ok"})
            assert await port.health(box)

    asyncio.run(scenario())


def test_running_requests_hold_their_tokens_in_the_usage_gauge_and_release_them() -> None:
    async def scenario() -> None:
        with sim(SimEngine.VLLM, cache_tokens=1000, prefill_tokens_per_second=50.0) as (app, client):
            port, box = adapter(SimEngine.VLLM, client), spec(SimEngine.VLLM)
            body = {"prompt": list(range(1, 11)), "max_tokens": 2}  # 10 prompt + 2 output tokens
            running = asyncio.create_task(client.post(f"{BASE}/box/1/v1/completions", json=body))
            while app.boxes[1].running == 0:  # noqa: ASYNC110 (the box's own state, nothing to wait on)
                await asyncio.sleep(0.001)
            assert (await port.capacity(box)).used_share == pytest.approx(12 / 1000)
            assert (await running).status_code == 200
            assert (await port.capacity(box)).used_share == 0.0

    asyncio.run(scenario())
