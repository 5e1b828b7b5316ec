"""bench.region_restart's model on a small fleet: paced work never exceeds the in-flight cap, the busiest
half of the volume is warm sooner than unpaced, and no schedule beats the computed lower bound."""

from __future__ import annotations

from bench.region_restart import PER_BOX, build, lower_bound, simulate
from warmer.core.fleet_pacing import FleetAdmission, FleetBudget


def test_the_paced_arm_is_capped_and_warms_the_busiest_volume_first() -> None:
    world = build(boxes=40, agents=160, warmup_tokens=4_096, seed=3)
    rate = 50_000.0
    unpaced_budget = FleetBudget(tokens_per_second=1e18, max_in_flight=10**9, max_wait_seconds=1e18)
    unpaced = simulate(world, rate, FleetAdmission(unpaced_budget, 1e18, lambda _b: PER_BOX), valued=False)
    paced_budget = FleetBudget(tokens_per_second=rate, max_in_flight=8)
    paced = simulate(world, rate, FleetAdmission(paced_budget, rate, lambda _b: PER_BOX), valued=True)
    assert paced["peak_in_flight"] <= 8 < unpaced["peak_in_flight"]
    assert paced["seconds_to_50pct_volume_warm"] < 0.5 * unpaced["seconds_to_50pct_volume_warm"]
    for level in (50, 90, 99):
        key = f"seconds_to_{level}pct_volume_warm"
        bound = lower_bound(world, rate, level / 100)
        assert bound <= paced[key] + 1e-9
        assert bound <= unpaced[key] + 1e-9
