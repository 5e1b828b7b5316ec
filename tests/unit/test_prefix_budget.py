"""The prefix budget of a shared token pool (`warmer.core.capacity`): live calls first, with headroom and a
floor, and a band that keeps the budget in force from following every small swing of load."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmer.core.capacity import (
    PrefixBudgetPolicy,
    budget_in_force,
    capacity_in_force,
    prefix_budget_tokens,
)
from warmer.core.model import BoxCapacity, BoxSpec, EngineKind
from warmer.core.placement import fit_to_capacity, handover

pools = st.integers(min_value=0, max_value=10_000_000)
shares = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
fractions = st.floats(min_value=0.0, max_value=0.99, allow_nan=False)


def test_the_budget_is_the_pool_less_the_working_set_with_headroom_less_the_floor() -> None:
    # 100k pool, 40% held by live calls, 25% headroom on them, 5% floor: 100k - 50k - 5k.
    assert prefix_budget_tokens(100_000, 0.4, headroom=0.25, floor=0.05) == 45_000
    assert prefix_budget_tokens(100_000, 0.0, headroom=0.25, floor=0.05) == 95_000


def test_a_full_pool_leaves_nothing_and_never_less() -> None:
    assert prefix_budget_tokens(100_000, 0.9, headroom=0.25, floor=0.05) == 0
    assert prefix_budget_tokens(0, 0.1) == 0


def test_an_unreported_share_counts_as_idle_and_a_stray_ratio_is_clamped() -> None:
    assert prefix_budget_tokens(10_000, None, floor=0.1) == 9_000
    assert prefix_budget_tokens(10_000, 1.7, headroom=0.0, floor=0.0) == 0
    assert prefix_budget_tokens(10_000, -0.2, headroom=0.0, floor=0.0) == 10_000


@given(pools, shares, shares, st.floats(min_value=0.0, max_value=4.0), fractions)
def test_more_load_never_leaves_more_room(
    pool: int, a: float, b: float, headroom: float, floor: float
) -> None:
    low, high = sorted((a, b))
    more = prefix_budget_tokens(pool, high, headroom=headroom, floor=floor)
    less = prefix_budget_tokens(pool, low, headroom=headroom, floor=floor)
    assert 0 <= more <= less <= pool


@given(pools, shares, st.floats(min_value=0.0, max_value=4.0), fractions)
def test_the_budget_always_leaves_the_working_set_with_headroom_and_the_floor(
    pool: int, share: float, headroom: float, floor: float
) -> None:
    budget = prefix_budget_tokens(pool, share, headroom=headroom, floor=floor)
    if budget > 0:
        assert budget + pool * share * (1 + headroom) + pool * floor <= pool + 1  # +1: whole tokens


def test_within_the_band_the_budget_in_force_stays_and_past_it_the_reading_applies() -> None:
    assert budget_in_force(None, 50_000, band=0.1) == 50_000  # nothing in force yet
    assert budget_in_force(50_000, 46_000, band=0.1) == 50_000  # -8%: kept
    assert budget_in_force(50_000, 54_000, band=0.1) == 50_000  # +8%: kept
    assert budget_in_force(50_000, 44_000, band=0.1) == 44_000  # -12%: the room is gone, at once
    assert budget_in_force(50_000, 56_000, band=0.1) == 56_000  # +12%: grows
    assert budget_in_force(0, 1, band=0.1) == 1  # from nothing, any room counts


@given(st.integers(min_value=0, max_value=10**7), st.lists(st.integers(0, 10**7), max_size=30), fractions)
def test_the_budget_in_force_is_always_within_the_band_of_the_last_reading_or_it(
    start: int, readings: list[int], band: float
) -> None:
    current = start
    for reading in readings:
        after = budget_in_force(current, reading, band=band)
        assert after in (current, reading)
        if after == current and reading != current:
            assert abs(reading - current) <= band * max(current, 1)
        current = after


def test_a_slow_drift_applies_once_it_adds_up_to_the_band() -> None:
    current = 100_000
    for reading in (97_000, 94_000, 91_000, 89_000):  # each read 3% below the last
        current = budget_in_force(current, reading, band=0.1)
    assert current == 89_000  # 11% below the budget that was in force


def test_the_policy_names_the_figure_it_refuses() -> None:
    with pytest.raises(ValueError, match="headroom"):
        PrefixBudgetPolicy(headroom=-0.1)
    with pytest.raises(ValueError, match="floor"):
        PrefixBudgetPolicy(floor=1.0)
    with pytest.raises(ValueError, match="band"):
        PrefixBudgetPolicy(band=-0.01)


def test_capacity_in_force_derives_the_budget_and_holds_it_within_the_band() -> None:
    policy = PrefixBudgetPolicy(headroom=0.25, floor=0.05, band=0.1)
    first = capacity_in_force(None, BoxCapacity(pool_tokens=100_000, used_share=0.2, source="e"), policy)
    assert first.tokens == 70_000
    wobble = capacity_in_force(first, BoxCapacity(pool_tokens=100_000, used_share=0.25, source="e"), policy)
    assert (wobble.tokens, wobble.used_share) == (70_000, 0.25)  # 63,750 is within 10% of 70,000
    busy = capacity_in_force(wobble, BoxCapacity(pool_tokens=100_000, used_share=0.4, source="e"), policy)
    assert busy.tokens == 45_000


def test_a_new_pool_starts_the_budget_afresh_and_a_reading_without_a_pool_stands() -> None:
    policy = PrefixBudgetPolicy(headroom=0.0, floor=0.0, band=0.5)
    old = BoxCapacity(tokens=100_000, pool_tokens=100_000, used_share=0.0)
    resized = capacity_in_force(old, BoxCapacity(pool_tokens=80_000, used_share=0.0), policy)
    assert resized.tokens == 80_000
    slots = BoxCapacity(prefixes=4, pinnable_slots=4, source="/props total_slots")
    assert capacity_in_force(old, slots, policy) == slots


def test_a_shrunk_token_budget_takes_the_quietest_retained_prefixes_off_the_box() -> None:
    """Placement keeps the target within a box's tokens, but an agent it can no longer place keeps its old
    route (move-before-switch). When the box's budget shrank with load, such retained prefixes beyond it
    would be evicted by the next warm while still routed: the quietest leave, the target stays."""
    box = BoxSpec(
        id="b1", base_url="http://b1:8080", engine=EngineKind.VLLM, model="m", cache_capacity_tokens=1150
    )
    previous = {"hot": ("b1",), "mid": ("b1",), "quiet": ("b1",)}
    target = {"hot": ("b1",), "mid": ("b1",)}  # quiet no longer fits: 3 x 500 > 1150
    prefix_of = {a: f"p-{a}" for a in previous}
    tokens = dict.fromkeys(previous, 500)
    moving = handover(previous, target, prefix_of, warm=set())
    assert moving.routing["quiet"] == ("b1",)  # unplaced: it keeps its old route
    volume = {"hot": 40.0, "mid": 10.0, "quiet": 1.0}
    fitted = fit_to_capacity(moving, target, prefix_of, {"b1": box}, volume, prefix_tokens=tokens)
    assert (fitted.routing["quiet"], fitted.keep_warm["quiet"]) == ((), ())
    assert fitted.routing["hot"] == fitted.routing["mid"] == ("b1",)
    roomy = replace(box, cache_capacity_tokens=1500)
    assert fit_to_capacity(moving, target, prefix_of, {"b1": roomy}, volume, prefix_tokens=tokens) is moving
    assert fit_to_capacity(moving, target, prefix_of, {"b1": box}, volume) is moving  # no sizes: counts only
