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
