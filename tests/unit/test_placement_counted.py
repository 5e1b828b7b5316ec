"""The single pass by counts (`counted_pass`) gives exactly the general pass's groups and steps wherever it
applies, and steps aside (None) wherever a prefix or token cap or a dedicated agent could refuse a box."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypothesis import event, given, settings
from hypothesis import strategies as st

from bench.baseline_greedy import Fill, single_pass
from tests.unit.placement_boxes import box
from warmer.core.model import BoxSpec
from warmer.core.placement import AgentDemand, PlacementConfig
from warmer.core.placement.counted import counted_pass
from warmer.core.placement.demand import Step, prepare
from warmer.core.placement.greedy import index_boxes
from warmer.core.placement.hashing import stable_seed, stable_seeds

MODELS = ("m1", "m2")


boxes_st = st.lists(
    st.builds(
        box,
        st.integers(min_value=0, max_value=60),
        st.sampled_from(MODELS),
        st.one_of(st.none(), st.none(), st.integers(min_value=500, max_value=60_000)),
        st.one_of(st.none(), st.none(), st.integers(min_value=1, max_value=12)),
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
            draw(st.integers(min_value=0, max_value=3000)),
            calls_per_minute=draw(st.sampled_from([0.0, 5.0, 45.0, 120.0, 300.0])),
            group_size=draw(st.one_of(st.none(), st.integers(min_value=1, max_value=4))),
            prefix_hash=draw(st.sampled_from(["", "", f"own-{i}"])),
        )
        for i in ids
    ]


def general(
    boxes: Sequence[BoxSpec],
    agents: Sequence[AgentDemand],
    config: PlacementConfig,
    previous: Mapping[str, Sequence[str]],
) -> tuple[dict[str, tuple[str, ...]] | None, dict[str, Step]]:
    """What the general pass gives: the groups (None when some agent got no box) and each agent's step."""
    index, spec = index_boxes(boxes, None, config.hash_buckets)
    demand = prepare(agents, config, spec, index, previous)
    fill = Fill(spec, config, demand.dedicated)
    trace: dict[str, Step] = {}
    return (fill.groups() if single_pass(demand, index, fill, trace) else None), trace


@settings(max_examples=300, deadline=None)
@given(
    boxes=boxes_st,
    agents=agents_st(),
    cap=st.integers(min_value=1, max_value=10),
    buckets=st.sampled_from([1, 3, 64]),
    dedicated=st.one_of(st.none(), st.none(), st.just(250.0)),
    data=st.data(),
)
def test_the_counted_pass_equals_the_general_pass_where_it_applies(
    boxes: list[BoxSpec],
    agents: list[AgentDemand],
    cap: int,
    buckets: int,
    dedicated: float | None,
    data: st.DataObject,
) -> None:
    config = PlacementConfig(
        max_agents_per_box=cap, hash_buckets=buckets, dedicated_calls_per_minute=dedicated
    )
    box_ids = [b.id for b in boxes] + ["gone"]
    previous = {
        a.agent_id: data.draw(st.lists(st.sampled_from(box_ids), max_size=4), label=f"previous {a.agent_id}")
        for a in agents
        if data.draw(st.booleans(), label=f"has previous {a.agent_id}")
    }  # boxes repeat, are gone or serve another model: the pass must treat them as the general one does
    expected, expected_trace = general(boxes, agents, config, previous)

    index, spec = index_boxes(boxes, None, config.hash_buckets)
    demand = prepare(agents, config, spec, index, previous)
    trace: dict[str, Step] = {}
    got = counted_pass(demand, index, spec, config, trace)

    largest = max((a.prefix_tokens for a in agents), default=0)
    only_counts_refuse = not demand.dedicated and all(
        (b.prefix_capacity is None or b.prefix_capacity >= cap)
        and (b.cache_capacity_tokens is None or cap * largest <= b.cache_capacity_tokens)
        for b in boxes
    )
    if got is None:
        event("stepped aside")
        assert not only_counts_refuse or expected is None
        return
    event("counted")
    assert only_counts_refuse
    assert got == expected
    assert trace == expected_trace


def test_a_fleet_where_agent_caps_bind_is_counted_exactly() -> None:
    """The case at fleet scale: boxes fill up to their agent cap and later agents walk past them."""
    boxes = [box(i, "m1", None, None) for i in range(12)]
    agents = [AgentDemand(f"a{i}", "m1", 1000, calls_per_minute=float(i % 5) * 20) for i in range(28)]
    config = PlacementConfig(max_agents_per_box=6, hash_buckets=4)
    previous = {"a3": ["b1", "b2"], "a7": ["b5"]}
    expected, expected_trace = general(boxes, agents, config, previous)
    index, spec = index_boxes(boxes, None, config.hash_buckets)
    trace: dict[str, Step] = {}
    got = counted_pass(prepare(agents, config, spec, index, previous), index, spec, config, trace)
    assert expected is not None
    assert got == expected
    assert trace == expected_trace
    assert any(not step.complete or step.examined != step.chosen for step in trace.values())  # refusals seen


def test_a_prefix_cap_below_the_agent_cap_leaves_it_to_the_general_pass() -> None:
    boxes = [box(0, "m1", None, 2), box(1, "m1", None, None)]
    agents = [AgentDemand(f"a{i}", "m1", 100) for i in range(3)]
    config = PlacementConfig(max_agents_per_box=4, hash_buckets=1)
    index, spec = index_boxes(boxes, None, config.hash_buckets)
    assert counted_pass(prepare(agents, config, spec, index, None), index, spec, config) is None


def test_many_seeds_at_once_equal_one_at_a_time() -> None:
    names = ["", "a", "agent-00001", "ümlaut", "x" * 300]
    assert stable_seeds("agent", names) == [stable_seed("agent", name) for name in names]
    assert stable_seeds("never-seen-before", ["a"]) == [stable_seed("never-seen-before", "a")]
