"""The capacity benchmark's pure pieces: where headroom reaches 0 and where TTFT climbs, and its table."""

from __future__ import annotations

from bench.capacity_headroom import StepFigures, crossings, fresh_prompt, markdown_table


def step(percent: int, headroom: float | None, p50_ratio: float, p90_ratio: float) -> StepFigures:
    return StepFigures(
        load_percent=percent,
        offered_tokens_per_second=percent * 5.0,
        engine_tokens_per_second=percent * 4.8,
        counter_tokens_per_second=None if headroom is None else 300.0 - headroom,
        headroom_tokens_per_second=headroom,
        headroom_fraction=None if headroom is None else headroom / 500.0,
        box_headroom_tokens_per_second=headroom,
        unrouted_samples=0 if headroom is not None else 3,
        samples=12,
        ttft_p50_ms=100.0 * p50_ratio,
        ttft_p90_ms=120.0 * p90_ratio,
        ttft_p50_ratio=p50_ratio,
        ttft_p90_ratio=p90_ratio,
        probes=10,
        dropped=0,
    )


def test_crossings_are_where_the_condition_holds_for_every_higher_step() -> None:
    steps = [  # out of order on purpose; a noisy low step and a step back under the threshold
        step(120, -250.0, 2.0, 3.1),
        step(0, 290.0, 1.0, 1.0),
        step(20, 200.0, 1.9, 2.5),  # one disturbed step starts no break
        step(60, 0.0, 1.1, 1.6),
        step(40, 90.0, 1.05, 1.2),
        step(80, -100.0, 1.7, 2.4),
        step(100, 20.0, 1.6, 2.0),  # headroom back above 0: its crossing starts after
    ]
    found = crossings(steps)
    assert found.headroom_zero_percent == 120
    assert found.ttft_p50_break_percent == 80
    assert found.ttft_p90_break_percent == 60
    assert crossings(steps[:2]).headroom_zero_percent == 120  # 0 counts as used up too
    assert crossings([step(0, 290.0, 1.0, 1.0), step(60, 0.0, 1.1, 1.6)]).headroom_zero_percent == 60


def test_crossings_not_reached_and_unknown_headroom_are_none() -> None:
    found = crossings([step(0, None, 1.0, 1.0), step(20, None, 1.2, 1.3)])
    assert (found.headroom_zero_percent, found.ttft_p50_break_percent, found.ttft_p90_break_percent) == (
        None,
        None,
        None,
    )
    assert crossings([step(20, 50.0, 1.2, 1.3)], break_ratio=1.2).ttft_p50_break_percent == 20


def test_table_has_one_row_per_step_in_load_order_and_dashes_for_unknown() -> None:
    table = markdown_table([step(40, 90.0, 1.05, 1.2), step(0, None, 1.0, 1.0)]).splitlines()
    assert len(table) == 4
    assert table[2].startswith("| 0% |")
    assert "| – | – | – | 3/12 |" in table[2]
    assert table[3].startswith("| 40% |")
    assert "| 90 | 0.18 | 90 | 0/12 |" in table[3]
    assert "1.05x" in table[3]


def test_fresh_prompts_have_the_size_asked_and_a_fresh_head_before_the_shared_filler() -> None:
    a, b = fresh_prompt(400), fresh_prompt(400)
    assert len(a) == len(b) == 400
    assert a[:32] != b[:32]
    assert a[32:] == b[32:]
    assert len(fresh_prompt(10)) == 10
