"""The admission gate's rules (`warmer.core.gate`): latch open, bound the hold, never hold out a model."""

from __future__ import annotations

import pytest

from warmer.core.gate import HELD_TOO_LONG, LATCHED, SHARE, GateBox, GateConfig, gate

NOW = 10_000.0


def box(
    box_id: str,
    *,
    up_for: float | None = 10.0,
    ready: bool = False,
    was_ready: bool = False,
    model: str = "m",
    group: str | None = None,
) -> GateBox:
    return GateBox(
        box_id=box_id,
        model=model,
        group=group,
        healthy_since=None if up_for is None else NOW - up_for,
        ready=ready,
        was_ready=was_ready,
    )


def admitted(answers: dict[str, object]) -> set[str]:
    return {b for b, a in answers.items() if a.admit}  # type: ignore[attr-defined]


def test_ready_boxes_are_admitted_and_a_warming_one_is_held_while_its_siblings_serve() -> None:
    answers = gate([box("a", ready=True), box("b", ready=True), box("c")], NOW, GateConfig())
    assert admitted(answers) == {"a", "b"}
    assert answers["c"].reason == "warming: held until ready"
    assert not answers["a"].released


def test_a_box_ready_earlier_in_its_epoch_stays_admitted_but_is_never_called_ready() -> None:
    answers = gate([box("a", ready=True), box("b", was_ready=True)], NOW, GateConfig())
    assert answers["b"].admit
    assert not answers["b"].ready
    assert answers["b"].release == LATCHED


def test_a_box_held_past_the_bound_is_released() -> None:
    config = GateConfig(max_hold_seconds=300.0, max_held_share=0.5)
    fleet = [box("a", ready=True), box("b", ready=True), box("c", up_for=299.0), box("d", up_for=301.0)]
    answers = gate(fleet, NOW, config)
    assert not answers["c"].admit
    assert answers["d"].admit
    assert answers["d"].release == HELD_TOO_LONG
    assert not answers["d"].ready


def test_every_box_of_a_model_cold_at_once_is_never_all_held_the_longest_held_go_first() -> None:
    """A first deploy or a region restart: nothing of the model is ready; half may be held, the boxes up
    longest are let in first, and another model's boxes do not count."""
    fleet = [box(f"m{i}", up_for=10.0 + i) for i in range(4)] + [box("x", model="other", ready=True)]
    answers = gate(fleet, NOW, GateConfig(max_held_share=0.5))
    assert admitted(answers) == {"m3", "m2", "x"}
    assert answers["m3"].release == SHARE
    assert "of model 'm'" in answers["m3"].reason


@pytest.mark.parametrize("count", [1, 2, 3])
def test_a_model_with_no_ready_box_always_has_one_admitted(count: int) -> None:
    answers = gate([box(f"b{i}", up_for=5.0 + i) for i in range(count)], NOW, GateConfig(max_held_share=0.9))
    assert len(admitted(answers)) >= 1


def test_the_share_holds_within_a_box_group_too() -> None:
    fleet = [
        box("a1", group="zone-a", ready=True),
        box("a2", group="zone-a", ready=True),
        box("b1", group="zone-b", up_for=20.0),
        box("b2", group="zone-b", up_for=10.0),
    ]
    answers = gate(fleet, NOW, GateConfig(max_held_share=0.5))
    # the model has 2 of 4 held (within its share), but zone-b would be held out whole
    assert admitted(answers) == {"a1", "a2", "b1"}
    assert "of group 'zone-b'" in answers["b1"].reason


def test_boxes_that_are_down_are_held_and_do_not_count_towards_the_share() -> None:
    answers = gate([box("a", up_for=None), box("b", up_for=30.0), box("c", ready=True)], NOW, GateConfig())
    assert not answers["a"].admit
    assert answers["a"].reason == "engine down"
    assert not answers["b"].admit  # 1 of 2 healthy boxes held: within half


def test_hold_nothing_and_the_bound_zero_admit_every_healthy_box() -> None:
    fleet = [box("a"), box("b"), box("c", ready=True)]
    assert admitted(gate(fleet, NOW, GateConfig(max_held_share=0.0))) == {"a", "b", "c"}
    assert admitted(gate(fleet, NOW, GateConfig(max_hold_seconds=0.0))) == {"a", "b", "c"}


@pytest.mark.parametrize(("field", "value"), [("max_hold_seconds", -1.0), ("max_held_share", 1.0)])
def test_bad_bounds_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        GateConfig(**{field: value})
