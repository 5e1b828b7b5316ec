"""Placement where prefix and token caps bind (the single pass by per-box room, `capped_pass`; coverage first
at once on a short fleet, its walks stopped when no box can take the agent) gives exactly what it gave before
(`bench.baseline_greedy`, kept verbatim): the same groups and unplaced agents, and the same steps (what the
incremental state keeps) wherever the single pass is the answer."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import event, given, settings
from hypothesis import strategies as st

from bench.baseline_greedy import Fill as BaselineFill
from bench.baseline_greedy import place as baseline_place
from bench.baseline_greedy import single_pass as baseline_single_pass
from tests.unit.placement_boxes import box
from warmer.core.model import BoxSpec
from warmer.core.placement import AgentDemand, PlacementConfig, PlacementState, place
from warmer.core.placement.capped import capped_pass
from warmer.core.placement.demand import Step, prepare
from warmer.core.placement.greedy import index_boxes

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
def agents_st(draw: st.DrawFn, sharing: int = 5, least: int = 0) -> list[AgentDemand]:
    """`sharing`: how many shared prefixes the agents that share one draw from; `least`: agents at least."""
    ids = draw(st.lists(st.integers(min_value=0, max_value=99), min_size=least, max_size=60, unique=True))
    return [
        AgentDemand(
            f"a{i}",
            draw(st.sampled_from(MODELS)),
            (i % 5) * 700 if draw(st.booleans()) else 1000,  # one size per shared prefix
            calls_per_minute=draw(st.sampled_from([0.0, 5.0, 45.0, 120.0, 300.0])),
            group_size=draw(st.one_of(st.none(), st.integers(min_value=1, max_value=4))),
            prefix_hash=draw(st.sampled_from(["", "", f"shared-{i % sharing}"])),
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


roomier_boxes_st = st.lists(
    st.builds(
        box,
        st.integers(min_value=0, max_value=60),
        st.sampled_from(MODELS),
        st.one_of(st.none(), st.integers(min_value=500, max_value=40_000)),
        st.one_of(st.none(), st.integers(min_value=1, max_value=12)),  # caps that bind now and then
    ),
    min_size=4,
    max_size=30,
    unique_by=lambda b: b.id,
)


@settings(max_examples=200, deadline=None)
@given(
    boxes=st.one_of(capped_boxes_st, roomier_boxes_st),
    agents=st.one_of(agents_st(), agents_st(sharing=2, least=6)),
    cap=st.integers(min_value=1, max_value=10),
    buckets=st.sampled_from([1, 3, 64]),
    dedicated=st.one_of(st.none(), st.none(), st.just(250.0)),
    data=st.data(),
)
def test_the_capped_pass_takes_the_general_passs_groups_and_steps(
    boxes: list[BoxSpec],
    agents: list[AgentDemand],
    cap: int,
    buckets: int,
    dedicated: float | None,
    data: st.DataObject,
) -> None:
    """Each agent's boxes, the boxes it looked at and the buckets it entered, exactly as the general single
    pass (`bench.baseline_greedy`) gives them, or None where that pass leaves some agent without a box."""
    agents = with_sizes_fixed(agents)
    config = PlacementConfig(
        max_agents_per_box=cap, hash_buckets=buckets, dedicated_calls_per_minute=dedicated
    )
    previous = previous_st(data, boxes, agents)
    index, spec = index_boxes(boxes, None, config.hash_buckets)
    demand = prepare(agents, config, spec, index, previous)
    fill = BaselineFill(spec, config, demand.dedicated)
    expected_trace: dict[str, Step] = {}
    single = baseline_single_pass(demand, index, fill, expected_trace)
    trace: dict[str, Step] = {}
    got = capped_pass(demand, index, spec, config, trace)
    if not single:
        event("some agent got no box")
        assert got is None
        return
    keys = [a.prefix_key for a in demand.ordered if a.agent_id in demand.incumbents]
    event("single pass, " + ("no prefix shared" if len(set(keys)) == len(keys) else "prefixes shared"))
    if any(step.examined != step.chosen for step in expected_trace.values()):
        event("some box refused an agent")
    assert got == fill.groups()
    assert trace == expected_trace


def test_shared_prefixes_and_a_dedicated_agent_take_the_general_passs_steps() -> None:
    """Prefixes shared on boxes whose slots and tokens run out, a dedicated agent, agents with boxes now:
    the cases the plain per-box room does not cover alone."""
    boxes = [box(i, "m1", 5_000 + 1_000 * (i % 3), 3 + i % 2) for i in range(20)]
    agents = [
        AgentDemand(
            f"a{i}",
            "m1",
            1_000 if i % 3 else 1_500,
            calls_per_minute=float(300 if i == 4 else (i * 7) % 60),
            group_size=1 + i % 3,
            prefix_hash="" if i % 3 else f"shared-{i % 2}",
        )
        for i in range(24)
    ]
    config = PlacementConfig(max_agents_per_box=3, hash_buckets=3, dedicated_calls_per_minute=250.0)
    previous = {"a5": ["b3", "b3", "gone"], "a9": ["b1"], "a12": ["b7", "b2"]}
    index, spec = index_boxes(boxes, None, config.hash_buckets)
    demand = prepare(agents, config, spec, index, previous)
    fill = BaselineFill(spec, config, demand.dedicated)
    expected_trace: dict[str, Step] = {}
    assert baseline_single_pass(demand, index, fill, expected_trace)
    trace: dict[str, Step] = {}
    assert capped_pass(demand, index, spec, config, trace) == fill.groups()
    assert trace == expected_trace
    assert demand.dedicated == {"a4"}
    assert any(step.examined != step.chosen for step in trace.values())  # refusals seen
    assert any(len(step.entered) > 1 for step in trace.values())  # walks past the best bucket
    groups = fill.groups()
    sharers = [a.agent_id for a in agents if a.prefix_hash == "shared-0"]
    assert any(sum(box_id in groups[a] for a in sharers) > 1 for box_id in spec)  # one prefix, two agents


def test_a_box_with_exactly_the_agents_tokens_left_takes_it() -> None:
    boxes = [box(0, "m1", 2_000, None), box(1, "m1", 1_000, None)]  # the third agent walks to b1
    agents = [AgentDemand(f"a{i}", "m1", 1_000, calls_per_minute=10.0 - i, group_size=1) for i in range(3)]
    config = PlacementConfig(max_agents_per_box=4, hash_buckets=1)
    index, spec = index_boxes(boxes, None, config.hash_buckets)
    demand = prepare(agents, config, spec, index, None)
    fill = BaselineFill(spec, config, demand.dedicated)
    expected_trace: dict[str, Step] = {}
    assert baseline_single_pass(demand, index, fill, expected_trace)
    trace: dict[str, Step] = {}
    assert capped_pass(demand, index, spec, config, trace) == fill.groups()
    assert trace == expected_trace
    assert sorted(b for g in fill.groups().values() for b in g) == ["b0", "b0", "b1"]


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
