"""The capped pass (`greedy.capped_pass`, with one record per box in `Fill`) gives exactly what placement gave
before it (`bench.baseline_greedy`, kept verbatim) on fleets where prefix and token caps bind: the same
groups, unplaced agents and, for the incremental state, the same steps as the walk of `single_pass`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypothesis import event, given, settings
from hypothesis import strategies as st

from bench.baseline_greedy import place as baseline_place
from tests.unit.placement_boxes import box
from warmer.core.model import BoxSpec
from warmer.core.placement import AgentDemand, PlacementConfig, PlacementState, place
from warmer.core.placement.demand import Step, prepare
from warmer.core.placement.greedy import Fill, capped_pass, index_boxes, single_pass

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


def passes(
    boxes: Sequence[BoxSpec],
    agents: Sequence[AgentDemand],
    config: PlacementConfig,
    previous: Mapping[str, Sequence[str]],
) -> list[tuple[bool, dict[str, tuple[str, ...]], dict[str, Step]]]:
    """What the walk (`single_pass`) and the capped pass give: whether every agent got a box, the groups
    and each agent's step."""
    results = []
    for single in (single_pass, capped_pass):
        index, spec = index_boxes(boxes, None, config.hash_buckets)
        demand = prepare(agents, config, spec, index, previous)
        fill = Fill(spec, config, demand.dedicated)
        trace: dict[str, Step] = {}
        complete = single(demand, index, fill, trace)
        results.append((complete, fill.groups(), trace))
    return results


@settings(max_examples=200, deadline=None)
@given(
    boxes=capped_boxes_st,
    agents=agents_st(),
    cap=st.integers(min_value=1, max_value=10),
    buckets=st.sampled_from([1, 3, 64]),
    dedicated=st.one_of(st.none(), st.none(), st.just(250.0)),
    data=st.data(),
)
def test_the_capped_pass_takes_the_steps_the_walk_takes(
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
    walked, capped = passes(boxes, agents, config, previous_st(data, boxes, agents))
    assert capped[0] == walked[0]
    if walked[0]:  # the steps of a pass that stopped early (an agent without a box) are not kept
        assert capped[1:] == walked[1:]
    event("single pass" if walked[0] else "coverage first")


def test_a_head_that_does_not_fit_whole_is_not_taken_in_part() -> None:
    """A prefix cap full on the second box of an agent's head: the agent walks on, and the first box it
    checked is not given to it twice."""
    boxes = [box(i, "m1", None, 1) for i in range(4)]
    agents = [AgentDemand(f"a{i}", "m1", 100, group_size=2) for i in range(3)]
    config = PlacementConfig(max_agents_per_box=4, hash_buckets=1)
    walked, capped = passes(boxes, agents, config, {})
    assert capped == walked
    assert not walked[0]  # 3 agents x 2 boxes on 4 one-prefix boxes: someone is left without a box


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
