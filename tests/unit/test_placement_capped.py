"""Placement where prefix and token caps bind (one record per box in `Fill`; coverage first at once on a short
fleet, its walks stopped when no box can take the agent) gives exactly what it gave before
(`bench.baseline_greedy`, kept verbatim): the same groups and unplaced agents."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import event, given, settings
from hypothesis import strategies as st

from bench.baseline_greedy import place as baseline_place
from tests.unit.placement_boxes import box
from warmer.core.model import BoxSpec
from warmer.core.placement import AgentDemand, PlacementConfig, PlacementState, place

MODELS = ("m1", "m2")

capped_boxes_st = st.lists(
    st.builds(
        box,
        st.integers(min_value=0, max_value=60),
        st.sampled_from(MODELS),
        st.one_of(st.none(), st.integers(min_value=500, max_value=12_000)),
        st.one_of(st.none(), st.integers(min_value=1, max_value=4)),  # llama.cpp-like slots: caps bind
    ),
    max_size=30,
    unique_by=lambda b: b.id,
)


@st.composite
def agents_st(draw: st.DrawFn) -> list[AgentDemand]:
    ids = draw(st.lists(st.integers(min_value=0, max_value=99), max_size=60, unique=True))
    return [
        AgentDemand(
            f"a{i}",
            draw(st.sampled_from(MODELS)),
            (i % 5) * 700 if draw(st.booleans()) else 1000,  # one size per shared prefix
            calls_per_minute=draw(st.sampled_from([0.0, 5.0, 45.0, 120.0, 300.0])),
            group_size=draw(st.one_of(st.none(), st.integers(min_value=1, max_value=4))),
            prefix_hash=draw(st.sampled_from(["", "", f"shared-{i % 5}"])),
        )
        for i in ids
    ]


def with_sizes_fixed(agents: list[AgentDemand]) -> list[AgentDemand]:
    """One prefix hash, one size (else the input is refused)."""
    sizes: dict[str, int] = {}
    fixed = []
    for agent in agents:
        if agent.prefix_hash:
            size = sizes.setdefault(agent.prefix_hash, agent.prefix_tokens)
            agent = AgentDemand(
                agent.agent_id,
                agent.model,
                size,
                calls_per_minute=agent.calls_per_minute,
                group_size=agent.group_size,
                prefix_hash=agent.prefix_hash,
            )
        fixed.append(agent)
    return fixed


def previous_st(
    data: st.DataObject, boxes: Sequence[BoxSpec], agents: Sequence[AgentDemand]
) -> dict[str, list[str]]:
    box_ids = [b.id for b in boxes] + ["gone"]
    return {
        a.agent_id: data.draw(st.lists(st.sampled_from(box_ids), max_size=4), label=f"previous {a.agent_id}")
        for a in agents
        if data.draw(st.booleans(), label=f"has previous {a.agent_id}")
    }  # boxes repeat, are gone or serve another model


@settings(max_examples=200, deadline=None)
@given(
    boxes=capped_boxes_st,
    agents=agents_st(),
    cap=st.integers(min_value=1, max_value=10),
    buckets=st.sampled_from([1, 3, 64]),
    dedicated=st.one_of(st.none(), st.none(), st.just(250.0)),
    data=st.data(),
)
def test_placement_on_capped_fleets_equals_the_previous_algorithm(
    boxes: list[BoxSpec],
    agents: list[AgentDemand],
    cap: int,
    buckets: int,
    dedicated: float | None,
    data: st.DataObject,
) -> None:
    agents = with_sizes_fixed(agents)
    config = PlacementConfig(
        max_agents_per_box=cap, hash_buckets=buckets, dedicated_calls_per_minute=dedicated
    )
    previous = previous_st(data, boxes, agents)
    got = place(boxes, agents, config, previous=previous)
    assert got == baseline_place(boxes, agents, config, previous=previous)
    event("some agent short or unplaced" if got.unplaced or got.short() else "every agent whole")


def test_a_full_fleet_still_takes_an_agent_whose_shared_prefix_a_box_holds() -> None:
    """Every box's one prefix slot is taken and one agent is left without a box (coverage first), yet a
    quieter agent sharing a held prefix still joins the box holding it: no box may take a new prefix, but
    that one needs none."""
    boxes = [box(i, "m1", None, 1) for i in range(2)]
    agents = [
        AgentDemand("busy", "m1", 100, calls_per_minute=300.0, group_size=1, prefix_hash="shared"),
        AgentDemand("own", "m1", 100, calls_per_minute=200.0, group_size=1),
        AgentDemand("left-out", "m1", 100, calls_per_minute=100.0, group_size=1),
        AgentDemand("sharer", "m1", 100, calls_per_minute=50.0, group_size=1, prefix_hash="shared"),
    ]
    config = PlacementConfig(max_agents_per_box=4, hash_buckets=1)
    got = place(boxes, agents, config)
    assert got == baseline_place(boxes, agents, config)
    assert got.groups["sharer"] == got.groups["busy"]
    assert set(got.unplaced) == {"left-out"}


def test_a_fleet_with_exactly_enough_slots_is_placed_in_one_pass() -> None:
    """As many distinct prefixes as prefix slots: every agent can still get a box, so the single pass runs
    (and the state stays incremental) instead of coverage first."""
    boxes = [box(i, "m1", None, 1) for i in range(2)]
    agents = [AgentDemand(f"a{i}", "m1", 100, calls_per_minute=5.0 * i, group_size=1) for i in range(2)]
    config = PlacementConfig(max_agents_per_box=4, hash_buckets=1)
    state = PlacementState(boxes, agents, config)
    assert state.incremental
    assert state.placement() == baseline_place(boxes, agents, config)
    assert sorted(b for g in state.placement().groups.values() for b in g) == ["b0", "b1"]
    agents.append(AgentDemand("a2", "m1", 100, group_size=1))  # one prefix more than slots: short
    assert not PlacementState(boxes, agents, config).incremental
