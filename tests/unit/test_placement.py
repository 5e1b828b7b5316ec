"""Placement: stable under fleet change, caps never violated, busy agents get more boxes, handover."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmer.core.model import BoxSpec, EngineKind
from warmer.core.placement import (
    AgentDemand,
    PlacementConfig,
    UnplacedReason,
    fit_to_capacity,
    handover,
    mix64,
    movement,
    place,
    stable_seed,
)

ROOMY = PlacementConfig(max_agents_per_box=10_000, min_group_size=2, max_group_size=2, hash_buckets=8)


def boxes(n: int, model: str = "m", capacity: int | None = None, start: int = 0) -> list[BoxSpec]:
    return [
        BoxSpec(
            id=f"box-{i}",
            base_url=f"http://10.0.0.{i}:8000",
            engine=EngineKind.LLAMACPP,
            model=model,
            cache_capacity_tokens=capacity,
        )
        for i in range(start, start + n)
    ]


def agents(n: int, model: str = "m", tokens: int = 1000) -> list[AgentDemand]:
    return [AgentDemand(agent_id=f"agent-{i}", model=model, prefix_tokens=tokens) for i in range(n)]


def test_stable_seed_is_process_independent_and_separates_parts() -> None:
    # blake2b, not hash(): the same in every process (a known value pins it).
    assert stable_seed("agent", "a") == stable_seed("agent", "a")
    assert stable_seed("ab", "c") != stable_seed("a", "bc")
    assert mix64(0) == 0
    assert mix64(1) != 1


def test_every_agent_gets_a_group_of_its_own_model_in_rank_order() -> None:
    fleet = boxes(6, "m1") + boxes(4, "m2", start=6)
    demand = [*agents(30, "m1"), AgentDemand("other", "m2", 500), AgentDemand("lost", "m3", 500)]
    three = PlacementConfig(max_agents_per_box=100, min_group_size=3, max_group_size=3)
    result = place(fleet, demand, three)
    by_id = {b.id: b for b in fleet}
    for agent in demand[:31]:
        group = result.groups[agent.agent_id]
        assert len(group) == 3
        assert len(set(group)) == 3
        assert {by_id[b].model for b in group} == {agent.model}
    assert result.unplaced == {"lost": UnplacedReason.NO_BOXES}
    # deterministic: the same input gives the same answer, group order included
    assert place(fleet, demand, three).groups == result.groups


def test_group_size_follows_volume_and_configuration() -> None:
    config = PlacementConfig(min_group_size=1, max_group_size=4, calls_per_minute_per_box=10.0)
    demand = [
        AgentDemand("quiet", "m", 100, calls_per_minute=0.0),
        AgentDemand("busy", "m", 100, calls_per_minute=25.0),
        AgentDemand("huge", "m", 100, calls_per_minute=500.0),
        AgentDemand("pinned", "m", 100, calls_per_minute=500.0, group_size=2),
    ]
    result = place(boxes(10), demand, config)
    assert {a: len(g) for a, g in result.groups.items()} == {"quiet": 1, "busy": 3, "huge": 4, "pinned": 2}


def test_dedicated_agent_has_its_boxes_alone() -> None:
    config = PlacementConfig(min_group_size=2, max_group_size=2, dedicated_calls_per_minute=100.0)
    demand = [AgentDemand("vip", "m", 100, calls_per_minute=150.0), *agents(20)]
    result = place(boxes(8), demand, config)
    assert result.dedicated == {"vip"}
    vip_boxes = set(result.groups["vip"])
    assert len(vip_boxes) == 2
    for agent, group in result.groups.items():
        if agent != "vip":
            assert not vip_boxes & set(group)


def test_short_capacity_gives_partial_then_unplaced() -> None:
    config = PlacementConfig(max_agents_per_box=2, min_group_size=2, max_group_size=2)
    result = place(boxes(3), agents(4), config)
    load = Counter(b for g in result.groups.values() for b in g)
    assert max(load.values()) <= 2
    assert sum(load.values()) == 6  # every slot used
    assert sum(len(g) for g in result.groups.values()) == 6
    assert result.short() or result.unplaced  # 4 agents x 2 wanted > 6 slots
    none_left = place(boxes(1), agents(3), PlacementConfig(max_agents_per_box=1, min_group_size=1))
    assert len(none_left.groups) == 1
    assert set(none_left.unplaced.values()) == {UnplacedReason.CAPACITY}


def test_coverage_comes_before_spill_room_when_cache_is_short() -> None:
    """6 agents wanting 2 boxes each on 3 boxes that hold 2 prompts each (llama.cpp, 2 slots): every agent
    is warm on one box, instead of 3 agents on 2 boxes and 3 agents nowhere (or 12 prefixes on 6 slots)."""
    fleet = [replace(b, prefix_capacity=2) for b in boxes(3)]
    demand = [AgentDemand(f"agent-{i}", "m", 3000, calls_per_minute=60.0 / (i + 1)) for i in range(6)]
    result = place(fleet, demand, PlacementConfig(min_group_size=2, max_group_size=4))
    assert not result.unplaced
    assert all(len(group) == 1 for group in result.groups.values())
    held = Counter(b for g in result.groups.values() for b in g)
    assert held == {"box-0": 2, "box-1": 2, "box-2": 2}
    # with room to spare the busiest agents get their spill boxes, the quiet ones keep one
    roomy = [replace(b, prefix_capacity=3) for b in boxes(3)]
    wider = place(roomy, demand, PlacementConfig(min_group_size=2, max_group_size=4))
    assert len(wider.groups["agent-0"]) == 2
    assert all(len(g) >= 1 for g in wider.groups.values())
    assert max(Counter(b for g in wider.groups.values() for b in g).values()) <= 3


def test_cache_capacity_counts_a_shared_prefix_once() -> None:
    config = PlacementConfig(min_group_size=1, max_group_size=1)
    shared = [AgentDemand(f"s{i}", "m", 600, prefix_hash="same") for i in range(3)]
    result = place(boxes(1, capacity=1000), shared, config)
    assert len(result.groups) == 3  # 600 tokens held once
    distinct = [AgentDemand(f"d{i}", "m", 600) for i in range(3)]
    result = place(boxes(1, capacity=1000), distinct, config)
    assert len(result.groups) == 1
    assert len(result.unplaced) == 2


def test_ineligible_boxes_are_not_used() -> None:
    fleet = boxes(5)
    result = place(fleet, agents(40), ROOMY, eligible={"box-0", "box-1", "box-2"})
    assert {b for g in result.groups.values() for b in g} <= {"box-0", "box-1", "box-2"}


def test_bad_input_names_the_field() -> None:
    with pytest.raises(ValueError, match="duplicate box id 'box-0'"):
        place(boxes(1) + boxes(1), agents(1))
    with pytest.raises(ValueError, match="duplicate agent id 'agent-0'"):
        place(boxes(1), agents(1) + agents(1))
    with pytest.raises(ValueError, match="prefix_tokens"):
        AgentDemand("a", "m", -1)
    mismatch = [AgentDemand("a", "m", 10, prefix_hash="p"), AgentDemand("b", "m", 11, prefix_hash="p")]
    with pytest.raises(ValueError, match=r"agents\['b'\].prefix_tokens"):
        place(boxes(1), mismatch)
    with pytest.raises(ValueError, match="max_group_size"):
        PlacementConfig(min_group_size=3, max_group_size=2)


def test_load_is_spread_over_all_boxes() -> None:
    result = place(boxes(20), agents(400), ROOMY)
    load = Counter(b for g in result.groups.values() for b in g)
    assert len(load) == 20
    assert max(load.values()) < 3 * (800 / 20)  # no hot spot beyond a few x the mean


fleet_sizes = st.integers(min_value=2, max_value=40)
agent_counts = st.integers(min_value=1, max_value=120)


@settings(max_examples=60, deadline=None)
@given(n_boxes=fleet_sizes, n_agents=agent_counts, removed=st.integers(min_value=0, max_value=1000))
def test_removing_a_box_moves_only_agents_that_had_it(n_boxes: int, n_agents: int, removed: int) -> None:
    fleet = boxes(n_boxes)
    before = place(fleet, agents(n_agents), ROOMY)
    gone = fleet[removed % n_boxes].id
    after = place([b for b in fleet if b.id != gone], agents(n_agents), ROOMY)
    for agent, group in before.groups.items():
        if gone in group:
            kept = [b for b in group if b != gone]
            assert after.groups[agent][: len(kept)] == tuple(kept)  # survivors keep their order
        else:
            assert after.groups[agent] == group


@settings(max_examples=60, deadline=None)
@given(n_boxes=fleet_sizes, n_agents=agent_counts)
def test_adding_a_box_only_pulls_agents_onto_it(n_boxes: int, n_agents: int) -> None:
    before = place(boxes(n_boxes), agents(n_agents), ROOMY)
    after = place(boxes(n_boxes + 1), agents(n_agents), ROOMY)
    new_box = f"box-{n_boxes}"
    for agent, group in before.groups.items():
        new_group = after.groups[agent]
        if new_box not in new_group:
            assert new_group == group
        else:
            assert len(set(group) - set(new_group)) == 1  # exactly one membership handed to the new box


def test_adding_one_box_moves_about_one_nth() -> None:
    n_boxes, n_agents = 50, 4000
    before = place(boxes(n_boxes), agents(n_agents), ROOMY)
    after = place(boxes(n_boxes + 1), agents(n_agents), ROOMY)
    moved = movement(before.groups, after.groups)
    ideal = 1 / (n_boxes + 1)
    assert moved.memberships_before == 2 * n_agents
    assert 0.5 * ideal < moved.fraction_moved < 2.0 * ideal


@settings(max_examples=80, deadline=None)
@given(
    n_boxes=st.integers(min_value=1, max_value=25),
    capacities=st.lists(
        st.one_of(st.none(), st.integers(min_value=0, max_value=5000)), min_size=1, max_size=25
    ),
    demand=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=3000),  # prefix tokens
            st.floats(min_value=0, max_value=300),  # calls per minute
            st.sampled_from(["", "shared-a", "shared-b"]),  # prefix hash
            st.sampled_from(["m1", "m2"]),
        ),
        min_size=1,
        max_size=80,
    ),
    cap=st.integers(min_value=1, max_value=6),
    dedicated=st.one_of(st.none(), st.floats(min_value=50, max_value=250)),
    prefix_caps=st.lists(st.one_of(st.none(), st.integers(min_value=1, max_value=4)), min_size=1, max_size=5),
)
def test_caps_are_never_violated(
    n_boxes: int,
    capacities: list[int | None],
    demand: list[tuple[int, float, str, str]],
    cap: int,
    dedicated: float | None,
    prefix_caps: list[int | None],
) -> None:
    fleet = [
        BoxSpec(
            id=f"b{i}",
            base_url="http://x",
            engine=EngineKind.VLLM,
            model=("m1", "m2")[i % 2],
            cache_capacity_tokens=capacities[i % len(capacities)],
            prefix_capacity=prefix_caps[i % len(prefix_caps)],
        )
        for i in range(n_boxes)
    ]
    shared_size = {"shared-a": 700, "shared-b": 1900}  # one prefix hash has one size
    wanted = [
        AgentDemand(f"a{i}", model, shared_size.get(prefix, tokens), calls_per_minute=cpm, prefix_hash=prefix)
        for i, (tokens, cpm, prefix, model) in enumerate(demand)
    ]
    config = PlacementConfig(
        max_agents_per_box=cap,
        min_group_size=1,
        max_group_size=4,
        calls_per_minute_per_box=40.0,
        dedicated_calls_per_minute=dedicated,
    )
    result = place(fleet, wanted, config)
    spec = {b.id: b for b in fleet}
    demand_by_id = {a.agent_id: a for a in wanted}
    on_box: dict[str, list[AgentDemand]] = {}
    for agent_id, group in result.groups.items():
        assert 1 <= len(group) <= result.wanted[agent_id]
        assert len(set(group)) == len(group)
        for box_id in group:
            assert spec[box_id].model == demand_by_id[agent_id].model
            on_box.setdefault(box_id, []).append(demand_by_id[agent_id])
    for box_id, held in on_box.items():
        assert len(held) <= cap
        capacity = spec[box_id].cache_capacity_tokens
        distinct = {a.prefix_hash or a.agent_id: a.prefix_tokens for a in held}
        if capacity is not None:
            assert sum(distinct.values()) <= capacity
        if spec[box_id].prefix_capacity is not None:
            assert len(distinct) <= spec[box_id].prefix_capacity
        if any(a.agent_id in result.dedicated for a in held):
            assert len(held) == 1
    # every agent is accounted for exactly once
    assert set(result.groups) | set(result.unplaced) == set(demand_by_id)
    assert not set(result.groups) & set(result.unplaced)


def test_handover_routes_new_boxes_only_once_warm() -> None:
    previous = {"a": ("b1", "b2")}
    target = {"a": ("b2", "b3")}
    prefix_of = {"a": "pa"}
    during = handover(previous, target, prefix_of, warm={("b1", "pa"), ("b2", "pa")})
    assert during.routing["a"] == ("b2", "b1")  # b3 not warm yet; b1 stays as spill
    assert during.keep_warm["a"] == ("b2", "b3", "b1")  # warm b3, keep b1 alive meanwhile
    assert during.pending["a"] == ("b3",)
    done = handover(previous, target, prefix_of, warm={("b2", "pa"), ("b3", "pa")})
    assert done.routing["a"] == ("b2", "b3")  # b1 leaves only now
    assert done.keep_warm["a"] == ("b2", "b3")
    assert "a" not in done.pending


def test_handover_other_cases() -> None:
    prefix_of = {"new": "pn", "gone": "pg", "moved": "pm"}
    result = handover(
        previous={"gone": ("b1",), "moved": ("b1", "b9")},
        target={"new": ("b1", "b2"), "moved": ("b2",)},
        prefix_of=prefix_of,
        warm={("b2", "pn")},
        existing={"b1", "b2"},
    )
    assert result.routing["new"] == ("b2",)  # a new agent is routed only where warm
    assert result.routing["gone"] == ("b1",)  # unplaced now: keeps its old route rather than none
    assert result.routing["moved"] == ("b1",)  # b9 left the fleet; b2 not warm yet
    assert result.keep_warm["moved"] == ("b2", "b1")


def test_retained_boxes_never_push_a_box_past_its_prefix_capacity() -> None:
    """Move-before-switch keeps old boxes serving; on a box full with its new agents, a retained prefix
    would be evicted by the next warm while still routed, so the quietest retained agent leaves it."""
    spec = {b.id: replace(b, prefix_capacity=2) for b in boxes(2)}
    previous = {"hot": ("box-0",), "quiet": ("box-1",), "mid": ("box-1",)}
    target = {"hot": ("box-1",), "mid": ("box-1",)}  # box-0 drained; quiet fits nowhere now
    prefix_of = {"hot": "p-hot", "quiet": "p-quiet", "mid": "p-mid"}
    moving = handover(previous, target, prefix_of, warm=set())
    assert moving.keep_warm["quiet"] == ("box-1",)  # without the fit: 3 prefixes on a 2-prompt box
    fitted = fit_to_capacity(moving, target, prefix_of, spec, {"hot": 40.0, "mid": 10.0, "quiet": 1.0})
    assert fitted.keep_warm["quiet"] == ()
    assert fitted.routing["quiet"] == ()
    assert fitted.keep_warm["hot"] == ("box-1", "box-0")  # hot keeps its old box until box-1 is warm
    assert fitted.routing["hot"] == ("box-0",)
    assert fitted.routing["mid"] == ("box-1",)
    unlimited = {b.id: b for b in boxes(2)}
    assert fit_to_capacity(moving, target, prefix_of, unlimited, {}) is moving
