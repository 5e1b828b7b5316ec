"""Planning on a box this replica took over: what its previous holder verified is re-probed before use,
and a warm it left in flight is abandoned at once (`Observed.trusted_after_by_box`)."""

from __future__ import annotations

from tests.unit.test_planner import config, desired, records, up, warm
from warmer.core.model import WarmRecord, WarmState
from warmer.core.plan_actions import AbandonWarm, ProbePrefix, ProbeReason
from warmer.core.planner import Observed, plan


def test_records_verified_before_the_takeover_are_probed_on_that_box_only() -> None:
    want = desired({"a": ("b1",), "b": ("b2",)})
    rows = records(warm("b1", "a", 100.0), warm("b2", "b", 100.0))
    taken_over = Observed(
        boxes={"b1": up(), "b2": up()}, warm=rows, trusted_after=50.0, trusted_after_by_box={"b2": 150.0}
    )
    probes = [a for a in plan(want, taken_over, 160.0, config()).actions if isinstance(a, ProbePrefix)]
    assert [(p.box_id, p.reason) for p in probes] == [("b2", ProbeReason.UNTRUSTED)]


def test_a_warm_left_by_the_previous_holder_is_abandoned_at_once() -> None:
    want = desired({"a": ("b1",)})
    row = WarmRecord("b1", "e1", "p-a", WarmState.WARMING, 1000, updated_at=100.0)
    taken_over = Observed(
        boxes={"b1": up()}, warm=records(row), trusted_after=50.0, trusted_after_by_box={"b1": 120.0}
    )
    assert plan(want, taken_over, 121.0, config(warming_timeout_seconds=300.0)).actions == (
        AbandonWarm("b1", "e1", "p-a", "left warming by an earlier daemon"),
    )
    held_all_along = Observed(boxes={"b1": up()}, warm=records(row), trusted_after=50.0)
    assert plan(want, held_all_along, 121.0, config(warming_timeout_seconds=300.0)).actions == ()
