"""Incremental placement: after any sequence of edits, exactly what a full `place` gives on the new inputs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.placement_boxes import box
from warmer.core.model import BoxSpec
from warmer.core.placement import (
    AgentDemand,
    Placement,
    PlacementConfig,
    PlacementState,
    greedy,
    incremental,
    place,
)

MODELS = ("m1", "m2")
SHARED = {"shared-a": 700, "shared-b": 1900}  # one prefix hash has one size


boxes_st = st.builds(
    box,
    st.integers(min_value=0, max_value=40),
    st.sampled_from(MODELS),
    st.one_of(st.none(), st.integers(min_value=500, max_value=8000)),
    st.one_of(st.none(), st.integers(min_value=1, max_value=6)),
)


@st.composite
def agent_st(draw: st.DrawFn) -> AgentDemand:
    prefix = draw(st.sampled_from(["", "", "shared-a", "shared-b"]))
    tokens = SHARED.get(prefix, draw(st.integers(min_value=0, max_value=3000)))
    return AgentDemand(
        f"a{draw(st.integers(min_value=0, max_value=80))}",
        draw(st.sampled_from(MODELS)),
        tokens,
        calls_per_minute=draw(st.sampled_from([0.0, 5.0, 45.0, 120.0, 300.0])),
        group_size=draw(st.one_of(st.none(), st.integers(min_value=1, max_value=3))),
        prefix_hash=prefix,
    )


def unique_by(items: list[BoxSpec]) -> list[BoxSpec]:
    seen: dict[str, BoxSpec] = {}
    for item in items:
        seen.setdefault(item.id, item)
    return list(seen.values())


class World:
    """The inputs as edited, in the order `PlacementState` promises to match."""

    def __init__(self, boxes: list[BoxSpec], agents: list[AgentDemand]) -> None:
        self.boxes = {b.id: b for b in boxes}
        self.agents = {a.agent_id: a for a in agents}
        self.eligible: set[str] | None = None
        self.previous: dict[str, tuple[str, ...]] = {}

    def full(self, config: PlacementConfig) -> Placement:
        return place(
            list(self.boxes.values()),
            list(self.agents.values()),
            config,
            eligible=self.eligible,
            previous=self.previous,
        )


def outcome(placement: Placement, agent_id: str) -> object:
    return placement.groups.get(agent_id), placement.unplaced.get(agent_id)


@settings(max_examples=150, deadline=None)
@given(
    initial_boxes=st.lists(boxes_st, min_size=0, max_size=14),
    initial_agents=st.lists(agent_st(), min_size=0, max_size=40, unique_by=lambda a: a.agent_id),
    cap=st.integers(min_value=1, max_value=8),
    dedicated=st.one_of(st.none(), st.sampled_from([100.0, 250.0])),
    data=st.data(),
)
def test_incremental_placement_equals_a_full_placement_after_every_edit(
    initial_boxes: list[BoxSpec],
    initial_agents: list[AgentDemand],
    cap: int,
    dedicated: float | None,
    data: st.DataObject,
) -> None:
    config = PlacementConfig(
        max_agents_per_box=cap,
        min_group_size=1,
        max_group_size=3,
        calls_per_minute_per_box=40.0,
        dedicated_calls_per_minute=dedicated,
        hash_buckets=4,  # several boxes per bucket: edits land in buckets agents have walked
    )
    world = World(unique_by(initial_boxes), initial_agents)
    state = PlacementState(list(world.boxes.values()), list(world.agents.values()), config)
    assert state.placement() == world.full(config)
    for _ in range(data.draw(st.integers(min_value=1, max_value=12), label="edits")):
        before = world.full(config)
        changed = apply_random_edit(data, world, state)
        after = world.full(config)
        assert state.placement() == after
        everyone = before.groups.keys() | after.groups.keys() | before.unplaced.keys() | after.unplaced.keys()
        moved = {a for a in everyone if outcome(before, a) != outcome(after, a)}
        assert moved <= changed  # the agents said to have changed include every one that did


def apply_random_edit(data: st.DataObject, world: World, state: PlacementState) -> frozenset[str]:
    kind = data.draw(st.sampled_from(["add", "remove", "eligible", "resize", "agent", "drop", "previous"]))
    box_ids = sorted(world.boxes)
    if kind == "add":
        new = data.draw(boxes_st)
        new = replace(new, id=f"n{len(world.boxes)}-{new.id}")
        if new.id in world.boxes:
            return frozenset()
        world.boxes[new.id] = new
        if world.eligible is not None:
            world.eligible.add(new.id)
        return state.add_box(new)
    if kind in ("remove", "eligible", "resize") and box_ids:
        target = data.draw(st.sampled_from(box_ids))
        if kind == "remove":
            del world.boxes[target]
            if world.eligible is not None:
                world.eligible.discard(target)
            return state.remove_box(target)
        if kind == "eligible":
            admit = data.draw(st.booleans())
            world.eligible = set(world.boxes) if world.eligible is None else world.eligible
            (world.eligible.add if admit else world.eligible.discard)(target)
            return state.set_eligible(target, admit)
        tokens = data.draw(st.one_of(st.none(), st.integers(min_value=500, max_value=8000)))
        resized = replace(world.boxes[target], cache_capacity_tokens=tokens)
        world.boxes[target] = resized
        return state.replace_box(resized)
    if kind == "agent":
        agent = data.draw(agent_st())
        world.agents[agent.agent_id] = agent
        return state.set_agent(agent)
    if kind == "drop" and world.agents:
        target = data.draw(st.sampled_from(sorted(world.agents)))
        del world.agents[target]
        return state.remove_agent(target)
    if kind == "previous" and world.agents:
        current = world.full(state.config).groups
        who = data.draw(st.sampled_from(sorted(world.agents)))
        group = data.draw(st.lists(st.sampled_from([*box_ids, "gone"]), max_size=3)) if box_ids else []
        world.previous = {**current, who: tuple(group)}
        return state.set_previous(world.previous)
    return frozenset()


def test_edits_of_a_roomy_fleet_stay_incremental_and_touch_few_agents() -> None:
    config = PlacementConfig(max_agents_per_box=50, min_group_size=2, max_group_size=2, hash_buckets=8)
    fleet = [box(i, "m1", None, None) for i in range(40)]
    demand = [AgentDemand(f"a{i}", "m1", 100) for i in range(400)]
    state = PlacementState(fleet, demand, config)
    assert state.incremental
    assert state.rebuild() == frozenset()  # placing again over the kept rankings changes nothing
    changed = state.remove_box("b7")
    had_it = {a for a, g in place(fleet, demand, config).groups.items() if "b7" in g}
    assert changed == had_it  # exactly the agents that lost the box
    assert state.incremental
    assert state.placement() == place([b for b in fleet if b.id != "b7"], demand, config)


def test_a_fleet_short_of_capacity_falls_back_to_full_placement_and_back() -> None:
    config = PlacementConfig(max_agents_per_box=2, min_group_size=1, max_group_size=1, hash_buckets=2)
    fleet = [box(i, "m1", None, None) for i in range(2)]
    demand = [AgentDemand(f"a{i}", "m1", 100) for i in range(5)]  # 5 agents, 4 places: coverage first
    state = PlacementState(fleet, demand, config)
    assert not state.incremental
    extra = box(9, "m1", None, None)
    state.add_box(extra)
    assert state.incremental  # room for everyone again
    assert state.placement() == place([*fleet, extra], demand, config)


def test_an_update_of_a_fleet_short_of_capacity_places_everyone_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a single pass to edit, each edit is a full placement: an update that changes every agent's
    volume (pre-call asks move them all each pass) runs one, after its last edit, not one per agent."""
    config = PlacementConfig(max_agents_per_box=2, min_group_size=1, max_group_size=3, hash_buckets=2)
    fleet = [box(i, "m1", None, None) for i in range(4)]
    demand = [AgentDemand(f"a{i}", "m1", 100) for i in range(12)]  # 12 agents, 8 places: coverage first
    state = PlacementState(fleet, demand, config)
    assert not state.incremental
    placements: list[int] = []
    full = greedy.place_indexed

    def counted(*args: Any, **kwargs: Any) -> Any:
        placements.append(1)
        return full(*args, **kwargs)

    monkeypatch.setattr(incremental, "place_indexed", counted)
    before = state.placement()
    busier = [replace(a, calls_per_minute=float(30 * (i % 4))) for i, a in enumerate(demand)]
    changed = state.update(fleet, busier)
    assert len(placements) == 1
    after = place(fleet, busier, config)
    assert state.placement() == after
    edited = {a.agent_id for a in busier if a.calls_per_minute}
    moved = {a.agent_id for a in demand if outcome(before, a.agent_id) != outcome(after, a.agent_id)}
    assert changed == edited | moved
    assert state.update(fleet, busier) == frozenset()
    assert len(placements) == 1  # nothing changed: nothing placed


def test_edits_name_unknown_and_duplicate_ids() -> None:
    state = PlacementState([box(0, "m1", None, None)], [AgentDemand("a", "m1", 10)])
    with pytest.raises(ValueError, match="duplicate box id 'b0'"):
        state.add_box(box(0, "m1", None, None))
    with pytest.raises(ValueError, match="unknown box id 'b5'"):
        state.remove_box("b5")
    with pytest.raises(ValueError, match="unknown agent id 'zz'"):
        state.remove_agent("zz")
    state.set_agent(AgentDemand("s1", "m1", 10, prefix_hash="p"))
    with pytest.raises(ValueError, match=r"agents\['s2'\].prefix_tokens"):
        state.set_agent(AgentDemand("s2", "m1", 11, prefix_hash="p"))
    assert "s2" not in state.placement().wanted  # a rejected edit changes nothing


def test_update_follows_inputs_rebuilt_every_pass() -> None:
    """The reconciler rebuilds boxes, agents, eligibility and routing every pass: `update` finds the edits."""
    config = PlacementConfig(max_agents_per_box=6, min_group_size=1, max_group_size=2, hash_buckets=4)
    fleet = [box(i, "m1", 4000, None) for i in range(12)]
    demand = [AgentDemand(f"a{i}", "m1", 900, calls_per_minute=float(i * 7 % 50)) for i in range(30)]
    state = PlacementState(fleet, demand, config)
    routing = dict(state.placement().groups)
    fleet2 = [b for b in fleet if b.id != "b3"] + [box(20, "m1", None, None)]
    fleet2[0] = replace(fleet2[0], cache_capacity_tokens=1000)
    demand2 = [replace(a, calls_per_minute=60.0) if a.agent_id == "a4" else a for a in demand[1:]]
    demand2.append(AgentDemand("a99", "m1", 900))
    eligible = {b.id for b in fleet2} - {"b5"}
    changed = state.update(fleet2, demand2, eligible=eligible, previous=routing)
    # in the state's order: known boxes where they were, the new box last
    order = [b for b in fleet if b.id != "b3"]
    order[0] = fleet2[0]
    expected = place([*order, fleet2[-1]], demand2, config, eligible=eligible, previous=routing)
    assert state.placement() == expected
    assert {"a0", "a99"} <= changed  # the agent that left, the one that came
    assert state.update(fleet2, demand2, eligible=eligible, previous=routing) == frozenset()
    with pytest.raises(ValueError, match="duplicate box id 'b0'"):
        state.update([*fleet2, fleet2[0]], demand2)
    held_back = box(21, "m1", None, None)  # known to the fleet, not admitted yet
    state.update([*fleet2, held_back], demand2, eligible=eligible, previous=routing)
    assert state.placement() == expected
    assert not any("b21" in group for group in state.placement().groups.values())


def test_a_box_added_but_not_admitted_serves_nobody() -> None:
    state = PlacementState([box(0, "m1", None, None)], [AgentDemand("a", "m1", 10)])  # wants 2 boxes
    assert state.add_box(box(1, "m1", None, None), eligible=False) == frozenset()
    assert state.placement().groups == {"a": ("b0",)}
    assert state.set_eligible("b1", True) == {"a"}
    assert state.placement().groups["a"] in {("b0", "b1"), ("b1", "b0")}
