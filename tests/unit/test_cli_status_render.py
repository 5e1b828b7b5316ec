"""`warmer status` shows a resumed epoch as resumed, not as a time to ready with a made-up overhead."""

from __future__ import annotations

from typing import Any

from warmer.cli.status import render_table


def box_row(box_id: str, time_to_ready: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": box_id,
        "healthy": True,
        "epoch": f"{box_id}-epoch",
        "warmup": "done",
        "ready": {"ready": True, "weight": 1.0, "reasons": []},
        "prefixes": [],
        "time_to_ready": time_to_ready,
    }


def line_of(table: str, box_id: str) -> list[str]:
    (line,) = [row for row in table.splitlines() if row.startswith(box_id + " ")]
    return line.split()


def test_a_resumed_box_shows_resumed_and_no_overhead_next_to_a_measured_one() -> None:
    measured = {
        "time_to_ready_seconds": 4.0,
        "engine_seconds": 3.0,
        "overhead_fraction": 0.25,
        "resumed": False,
        "reverify_seconds": None,
    }
    resumed = {
        "time_to_ready_seconds": None,
        "engine_seconds": None,
        "overhead_fraction": None,
        "resumed": True,
        "reverify_seconds": 0.4,
    }
    table = render_table([box_row("b1", measured), box_row("b2", resumed)], {})
    assert line_of(table, "b1")[-3:] == ["4.00s", "3.00s", "25.0%"]
    assert line_of(table, "b2")[-3:] == ["resumed", "-", "-"]


def test_late_health_answers_and_lease_holders_are_shown() -> None:
    """A box keeping its routes through late health answers says so; with several replicas a HOLDER column
    names each box's lease holder and marks the replica answering (`*`); alone, there is no such column."""
    held = {**box_row("b1", {}), "health_slow_polls": 1, "lease_holder": "replica-a", "held_here": True}
    other = {**box_row("b2", {}), "lease_holder": "replica-b", "held_here": False}
    unheld = {**box_row("b3", {}), "lease_holder": None, "held_here": False}
    table = render_table([held, other, unheld], {})
    assert table.splitlines()[0].split()[-1] == "HOLDER"
    assert line_of(table, "b1")[1:3] == ["up,", "1"]
    assert line_of(table, "b1")[-2:] == ["replica-a", "*"]
    assert line_of(table, "b2")[-1] == "replica-b"
    assert line_of(table, "b3")[-1] == "-"
    alone = render_table([box_row("b1", {})], {})
    assert "HOLDER" not in alone
    assert line_of(alone, "b1")[1] == "up"
