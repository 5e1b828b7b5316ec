"""The numpy ranking kernel gives exactly the keys of the pure SplitMix64 reference (`sort_key`), so a
placement hashed in batches equals one hashed an agent at a time."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from warmer.core.placement.hashing import (
    INDEX_MASK,
    Lanes,
    best_members,
    key_matrix,
    ranked_key_rows,
    seed_array,
    sort_key,
    stable_seed,
)
from warmer.core.placement.ranking import BoxIndex, rendezvous_order

seeds64 = st.integers(min_value=0, max_value=(1 << 64) - 1)


@settings(max_examples=200, deadline=None)
@given(
    agents=st.lists(seeds64, min_size=1, max_size=40),
    members=st.lists(seeds64, min_size=1, max_size=90),
)
def test_numpy_keys_equal_the_pure_reference(agents: list[int], members: list[int]) -> None:
    reference = [[sort_key(agent, seed, j) for j, seed in enumerate(members)] for agent in agents]
    assert key_matrix(seed_array(agents), seed_array(members)).tolist() == reference
    ranked = [sorted(row, reverse=True) for row in reference]
    assert ranked_key_rows(seed_array(agents), seed_array(members)).tolist() == ranked
    assert best_members(seed_array(agents), seed_array(members)) == [row[0] & INDEX_MASK for row in ranked]
    lanes = Lanes(members)
    assert [lanes.ranked_keys(agent) for agent in agents] == ranked


def test_extreme_seeds_wrap_as_the_reference_masks() -> None:
    edges = [0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, 0xBF58476D1CE4E5B9]
    got = key_matrix(seed_array(edges), seed_array(edges)).tolist()
    assert got == [[sort_key(a, s, j) for j, s in enumerate(edges)] for a in edges]


def test_more_rows_than_one_batch_are_all_computed() -> None:
    agents = [stable_seed("agent", str(i)) for i in range(5000)]
    members = [stable_seed("box", str(i)) for i in range(3)]
    got = key_matrix(seed_array(agents), seed_array(members)).tolist()
    assert got[4999] == [sort_key(agents[4999], seed, j) for j, seed in enumerate(members)]
    assert got[0] == [sort_key(agents[0], seed, j) for j, seed in enumerate(members)]


def _walks(index: BoxIndex, agents: list[str], model: str) -> list[list[str]]:
    return [list(index.walk(a, stable_seed("agent", a), model)) for a in agents]


@settings(max_examples=40, deadline=None)
@given(
    n_boxes=st.integers(min_value=1, max_value=60),
    buckets=st.integers(min_value=1, max_value=8),
    removed=st.integers(min_value=0, max_value=59),
)
def test_primed_walks_equal_lazy_walks_also_after_a_box_leaves(
    n_boxes: int, buckets: int, removed: int
) -> None:
    agents = [f"agent-{i}" for i in range(30)]
    lazy, primed = BoxIndex(buckets), BoxIndex(buckets)
    for index in (lazy, primed):
        for i in range(n_boxes):
            index.add(f"box-{i}", "m")
        index.add("other-0", "other-model")
    primed.prime([(a, stable_seed("agent", a), "m") for a in agents])
    primed.prime([("no-boxes", 1, "absent-model")])  # a model without boxes is skipped
    held = primed._rankings  # what the walks below read instead of hashing again
    assert set(agents) <= held.keys()
    assert "no-boxes" not in held
    assert _walks(primed, agents, "m") == _walks(lazy, agents, "m")
    gone = f"box-{removed % n_boxes}"
    lazy.remove(gone)
    primed.remove(gone)
    primed.prime([(a, stable_seed("agent", a), "m") for a in agents])  # re-ranks the invalidated bucket
    walks = _walks(primed, agents, "m")
    assert walks == _walks(lazy, agents, "m")
    assert all(gone not in walk for walk in walks)


@settings(max_examples=50, deadline=None)
@given(
    agent=st.text(min_size=1, max_size=8),
    fleet=st.lists(st.integers(min_value=0, max_value=500), min_size=1, max_size=60, unique=True),
    data=st.data(),
)
def test_rendezvous_order_of_some_boxes_is_their_order_in_the_agents_walk(
    agent: str, fleet: list[int], data: st.DataObject
) -> None:
    """Incumbent boxes read from shared facts are ordered without an index, as every replica's walk
    over whatever fleet it has indexed would order them."""
    ids = [f"box-{i}" for i in fleet]
    index = BoxIndex(8)
    for box_id in ids:
        index.add(box_id, "m")
    some = data.draw(st.lists(st.sampled_from(ids), unique=True))
    walk = list(index.walk(agent, stable_seed("agent", agent), "m"))
    assert rendezvous_order(agent, some, 8) == [box_id for box_id in walk if box_id in set(some)]
