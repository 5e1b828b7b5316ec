"""The fleet pacing rule (`warmer.core.fleet_pacing`): budget, order, aging, strictness, urgency."""

from __future__ import annotations

import pytest

from warmer.core.fleet_pacing import (
    FleetAdmission,
    FleetBudget,
    Ticket,
    WorkKind,
    box_values,
    carried_values,
    fleet_rate,
    lower_bound_seconds,
    restart_warmup_cost,
    warm_value,
)
from warmer.core.model import EngineKind, ModelProfile, RestartRecipe


def ticket(key: str, value: float = 0.0, cost: float = 100.0, *, box: str | None = None, at: float = 0.0,
           urgent: bool = False) -> Ticket:  # fmt: skip
    return Ticket(key, WorkKind.WARM, box or key, value, cost, at, urgent)


def admission(
    rate: float = 100.0, *, in_flight: int = 64, per_box: int = 2, wait: float = 120.0
) -> FleetAdmission:
    budget = FleetBudget(tokens_per_second=rate, max_in_flight=in_flight, max_wait_seconds=wait)
    return FleetAdmission(budget, rate, lambda _box: per_box)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tokens_per_second", 0.0),
        ("warm_share", 0.0),
        ("warm_share", 1.5),
        ("max_in_flight", 0),
        ("max_wait_seconds", 0.0),
        ("burst_seconds", -1.0),
    ],
)
def test_a_bad_budget_is_refused_by_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        FleetBudget(**{field: value})  # type: ignore[arg-type]


def test_the_derived_rate_sums_declared_rates_times_the_share_and_the_fallback_elsewhere() -> None:
    budget = FleetBudget(warm_share=0.25)
    assert fleet_rate(budget, [40_000.0, None, 20_000.0], 8_000.0) == 10_000 + 8_000 + 5_000
    assert fleet_rate(FleetBudget(tokens_per_second=3_000.0), [40_000.0], 8_000.0) == 3_000.0
    assert fleet_rate(budget, [], 8_000.0) == 8_000.0  # an empty fleet still admits one box's worth


def test_work_is_admitted_most_valuable_first_within_the_in_flight_cap() -> None:
    pacing = admission(rate=1e9, in_flight=3)
    for key, value in [("low", 1.0), ("top", 9.0), ("mid", 5.0), ("high", 7.0), ("zero", 0.0)]:
        pacing.enqueue(ticket(key, value))
    assert [t.key for t in pacing.admit(0.0)] == ["top", "high", "mid"]
    assert pacing.admit(0.0) == []  # three running: the cap holds
    pacing.release("high")
    assert [t.key for t in pacing.admit(0.0)] == ["low"]
    pacing.release("top")
    pacing.release("mid")
    assert [t.key for t in pacing.admit(0.0)] == ["zero"]


def test_equal_values_go_in_arrival_order() -> None:
    pacing = admission(rate=1e9)
    for key in ["a3", "a1", "a2"]:
        pacing.enqueue(ticket(key, 1.0))
    assert [t.key for t in pacing.admit(0.0)] == ["a3", "a1", "a2"]


def test_the_bucket_admits_no_more_than_its_rate_and_says_when_the_next_goes() -> None:
    pacing = admission(rate=100.0)  # bucket: 100 tokens (one second)
    for index in range(5):
        pacing.enqueue(ticket(f"t{index}", value=10.0 - index, cost=60.0))
    assert [t.key for t in pacing.admit(0.0)] == ["t0"]  # 100 -> 40: 60 more do not fit
    assert pacing.next_check_at(0.0) == pytest.approx(0.2)  # 20 more tokens at 100/s
    assert pacing.admit(0.1) == []
    assert [t.key for t in pacing.admit(0.2)] == ["t1"]
    assert [t.key for t in pacing.admit(0.8)] == ["t2"]
    assert pacing.tokens(0.8) == pytest.approx(0.0)


def test_a_piece_larger_than_the_bucket_goes_from_a_full_one_and_leaves_debt() -> None:
    pacing = admission(rate=100.0)
    pacing.enqueue(ticket("long", value=5.0, cost=1_000.0))
    pacing.enqueue(ticket("next", value=1.0, cost=10.0))
    assert [t.key for t in pacing.admit(0.0)] == ["long"]
    assert pacing.tokens(0.0) == pytest.approx(-900.0)
    assert pacing.admit(9.0) == []  # 0 tokens: 10 do not fit yet
    assert [t.key for t in pacing.admit(9.2)] == ["next"]


def test_work_that_sends_more_than_its_ticket_said_is_charged_and_later_work_waits_it_out() -> None:
    pacing = admission(rate=100.0)  # bucket: 100 tokens
    pacing.enqueue(ticket("warm", value=5.0, cost=60.0))
    pacing.enqueue(ticket("next", value=1.0, cost=60.0))
    assert [t.key for t in pacing.admit(0.0)] == ["warm"]  # 100 -> 40
    pacing.charge(60.0, 0.0)  # the warm was contested and warmed again within its admission: 40 -> -20
    assert pacing.tokens(0.0) == pytest.approx(-20.0)
    assert pacing.admit(0.5) == []  # 30 tokens: 60 do not fit (uncharged, 90 would have)
    assert [t.key for t in pacing.admit(0.8)] == ["next"]
    with pytest.raises(ValueError, match="tokens"):
        pacing.charge(-1.0, 0.8)


def test_order_is_strict_a_cheap_piece_does_not_overtake_a_blocked_valuable_one() -> None:
    pacing = admission(rate=100.0)
    pacing.enqueue(ticket("first", value=9.0, cost=90.0))
    pacing.enqueue(ticket("big", value=8.0, cost=80.0))
    pacing.enqueue(ticket("cheap", value=1.0, cost=5.0))
    assert [t.key for t in pacing.admit(0.0)] == ["first"]  # 10 left: "cheap" would fit, "big" waits first
    assert pacing.admit(0.5) == []
    assert [t.key for t in pacing.admit(0.7)] == ["big"]


def test_a_box_at_its_concurrency_is_passed_over_without_blocking_the_fleet() -> None:
    pacing = admission(rate=1e9, per_box=1)
    pacing.enqueue(ticket("b1-a", 9.0, box="b1"))
    pacing.enqueue(ticket("b1-b", 8.0, box="b1"))
    pacing.enqueue(ticket("b2-a", 1.0, box="b2"))
    assert [t.key for t in pacing.admit(0.0)] == ["b1-a", "b2-a"]
    pacing.release("b1-a")
    assert [t.key for t in pacing.admit(0.0)] == ["b1-b"]  # passed over, not dropped


def test_work_that_waited_too_long_goes_before_fresher_valuable_work() -> None:
    pacing = admission(rate=1e9, in_flight=1, wait=60.0)
    pacing.enqueue(ticket("low", 0.0, at=0.0))
    pacing.enqueue(ticket("hot", 9.0, at=0.0))
    assert [t.key for t in pacing.admit(0.0)] == ["hot"]
    pacing.release("hot")
    for second in range(1, 70):  # a steady stream of valuable work would keep "low" waiting forever
        pacing.enqueue(ticket(f"hot{second}", 9.0, at=float(second)))
        admitted = [t.key for t in pacing.admit(float(second))]
        for key in admitted:
            pacing.release(key)
        if admitted == ["low"]:
            assert second >= 60  # it went by age, not before
            break
    else:
        pytest.fail("the low-value piece starved")


def test_urgent_work_goes_at_once_and_pays_the_bucket() -> None:
    pacing = admission(rate=100.0, in_flight=1)
    pacing.enqueue(ticket("paced", 9.0, cost=50.0))
    assert [t.key for t in pacing.admit(0.0)] == ["paced"]
    pacing.enqueue(ticket("precall", 0.0, cost=500.0, urgent=True))
    assert [t.key for t in pacing.admit(0.0)] == ["precall"]  # past the in-flight cap and the bucket
    assert pacing.tokens(0.0) == pytest.approx(-450.0)


def test_withdrawn_work_leaves_the_queue() -> None:
    pacing = admission(rate=1e9)
    pacing.enqueue(ticket("gone", 9.0))
    pacing.enqueue(ticket("kept", 1.0))
    pacing.withdraw("gone")
    assert [t.key for t in pacing.admit(0.0)] == ["kept"]
    with pytest.raises(ValueError, match="already"):
        pacing.enqueue(ticket("kept"))


def test_values_are_calls_a_minute_times_prefix_tokens_and_a_box_keeps_what_it_held() -> None:
    volume = {"busy": 10.0, "quiet": 1.0}
    assert warm_value(["busy", "quiet"], 1_000, volume) == 11_000.0
    held = box_values(
        {"busy": ["b1", "b2"], "quiet": ["b2"], "idle": ["b3"]}, volume, {"busy": 100, "quiet": 50}
    )
    assert held == {"b1": 1_000.0, "b2": 1_050.0}
    after_restart = box_values({"busy": ["b2"], "quiet": ["b2"]}, volume, {"busy": 100, "quiet": 50})
    assert carried_values(held, after_restart) == {"b1": 1_000.0, "b2": 1_050.0}


def test_a_restart_warm_up_costs_its_long_prefill_and_its_short_prompts() -> None:
    profile = ModelProfile(
        name="m", engine=EngineKind.LLAMACPP, slots=4, context_length=4096,
        restart=RestartRecipe(burst_levels=(1, 8)),
    )  # fmt: skip
    short = (profile.restart.sampled is not None) + (profile.restart.constrained is not None)
    assert restart_warmup_cost(profile, 3_000, slots=4) == 3_000 + 64 * (short + 1 + 4)
    assert lower_bound_seconds(10_100.0, rate=100.0, burst=100.0) == pytest.approx(100.0)
