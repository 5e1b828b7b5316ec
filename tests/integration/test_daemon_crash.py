"""A `warmer serve` process killed with SIGKILL (no graceful shutdown) and a new one started on the same
config and SQLite file, over two real llama-server boxes that keep running throughout.

What must hold:
1. nothing committed is lost: every event row, warm record, epoch and restart phase written before the
   crash is still there, unchanged where nothing re-verified it, and the new process appends after them;
2. the new daemon does not trust the old rows blindly: a record verified before it started is re-probed
   (`ProbeReason.UNTRUSTED`, warmer/core/planner.py) before the box counts as ready or is routed; the
   engines did not restart, so their epochs are the same (llama-server's /props `media_marker` is drawn once
   per engine process, warmer/adapters/engines/llamacpp.py) and the restart warm-up is NOT run again;
3. after the re-verification a real turn-1 request to a routed box is served from the engine's cache
   (`timings.cache_n`, ggml-org/llama.cpp tools/server/README.md).

Bounded waits only, no timing assertions.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from testbed.fleet import free_loopback_port
from tests.integration.daemon_harness import (
    AGENT,
    AGENTS_DIR,
    FleetFactory,
    Serve,
    fleet_boxes,
    running_serve,
    stable_prefix,
    turn1,
    write_config,
)
from warmer.config.agents import load_agent_specs
from warmer.core.model import PhaseName

pytestmark = pytest.mark.integration

UNTRUSTED_PROBE = "probe (untrusted) saw the hit"  # the reconciler's reason for a re-verified old record


Row = dict[str, Any]


def read_db(path: Path) -> dict[str, list[Row]]:
    """The tables this test compares, read through a read-only connection (WAL: readers never block)."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    connection.row_factory = sqlite3.Row
    try:
        queries = {
            "events": "SELECT * FROM events ORDER BY id",
            "warm": "SELECT * FROM warm_records ORDER BY box_id, epoch, prefix_hash",
            "epochs": "SELECT * FROM box_epochs ORDER BY box_id, epoch",
            "phases": "SELECT * FROM restart_phases ORDER BY box_id, epoch, phase",
        }
        tables = {name: [dict(row) for row in connection.execute(sql)] for name, sql in queries.items()}
    finally:
        connection.close()
    for event in tables["events"]:
        event["detail"] = json.loads(event["detail"]) if event["detail"] else {}
    return tables


def by_key(rows: list[Row], *keys: str) -> dict[tuple[Any, ...], Row]:
    return {tuple(row[key] for key in keys): row for row in rows}


def kinds(events: list[Row], kind: str, box_id: str) -> list[Row]:
    return [e for e in events if e["kind"] == kind and e["box_id"] == box_id]


def test_a_killed_daemon_loses_nothing_and_its_successor_re_verifies_before_routing(
    llama_fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    fleet = llama_fleet_factory(2, slots=2, ctx_per_slot=4096)
    box_ids = sorted(box.id for box in fleet.boxes)
    port = free_loopback_port()
    config = write_config(tmp_path, fleet_boxes(fleet), port)
    database = tmp_path / "state" / "warmer.db"
    agent = load_agent_specs(AGENTS_DIR)[AGENT]
    stable = stable_prefix(agent)

    def ready_in_db() -> bool:
        events = read_db(database)["events"]
        return all(kinds(events, "box_ready", box_id) for box_id in box_ids)

    def settled(serve: Serve) -> None:
        """Both boxes ready, the agent routed to both, and the daemon's ready moments written down."""
        serve.wait("both boxes ready", lambda: all(serve.is_ready(box_id) for box_id in box_ids))
        serve.wait("the agent routed to both boxes", lambda: serve.agent_routes() == (stable.hash, box_ids))
        serve.wait("box_ready events in the database", ready_in_db, 60.0)

    with running_serve(config, port, tmp_path / "serve-1.log") as first:
        settled(first)
        before = read_db(database)
        first.process.send_signal(signal.SIGKILL)
        assert first.process.wait(timeout=30) == -signal.SIGKILL
    crashed = read_db(database)  # everything the killed process committed

    # The warm state the first daemon left: the agent's prefix warm on both boxes, one epoch each.
    epochs = {row["box_id"]: row["epoch"] for row in crashed["epochs"]}
    assert sorted(epochs) == box_ids
    assert len(crashed["epochs"]) == len(box_ids)
    old_warm = by_key(crashed["warm"], "box_id", "epoch", "prefix_hash")
    assert sorted(old_warm) == sorted((box_id, epochs[box_id], stable.hash) for box_id in box_ids)
    assert all(row["state"] == "warm" and row["verified_at"] is not None for row in old_warm.values())
    # The crash itself lost nothing committed while the daemon ran.
    assert crashed["events"][: len(before["events"])] == before["events"]
    assert set(by_key(before["warm"], "box_id", "epoch", "prefix_hash")) <= set(old_warm)
    boundary = max(event["id"] for event in crashed["events"])

    with running_serve(config, port, tmp_path / "serve-2.log") as second:
        settled(second)
        # GET /v1/boxes/{id} shows the resumed readiness honestly: no time to ready, no overhead.
        views = {box_id: second.box(box_id)["time_to_ready"] for box_id in box_ids}
        routed = second.routed_boxes()
        # (3) A real first turn on a routed box reuses the whole stable prefix.
        first_turn = turn1(fleet.box(routed[0]).base_url, agent)
        assert first_turn["timings"]["cache_n"] >= stable.token_count - 1
        second.stop()
    after = read_db(database)

    # (1) Nothing lost: every old event row is still there, byte for byte, and the new ones come after.
    old_events = after["events"][: len(crashed["events"])]
    assert old_events == crashed["events"]
    new_events = [e for e in after["events"] if e["id"] > boundary]
    assert new_events
    assert len(after["events"]) == len(crashed["events"]) + len(new_events)
    # Same engine processes -> same epochs: no epoch row added, none dropped, no warm record dropped.
    assert (
        by_key(after["epochs"], "box_id", "epoch").keys()
        == by_key(crashed["epochs"], "box_id", "epoch").keys()
    )
    assert not [e for e in new_events if e["kind"] in ("epoch_changed", "warm_dropped")]
    new_warm = by_key(after["warm"], "box_id", "epoch", "prefix_hash")
    assert set(new_warm) == set(old_warm)
    for key, old in old_warm.items():
        renewed = new_warm[key]
        assert renewed["state"] == "warm"
        assert renewed["warmed_at"] == old["warmed_at"]  # one continuous warm stretch across the crash
        assert renewed["verified_at"] > old["verified_at"]  # ...re-verified by the new daemon

    for box_id in box_ids:
        epoch = epochs[box_id]
        # (2a) No restart warm-up re-run for an epoch whose warm-up already finished: the restart phases
        # written by the first daemon are untouched and no restart_warmup event follows the crash.
        assert not kinds(new_events, "restart_warmup", box_id)
        old_phases = by_key([p for p in crashed["phases"] if p["box_id"] == box_id], "epoch", "phase")
        new_phases = by_key([p for p in after["phases"] if p["box_id"] == box_id], "epoch", "phase")
        assert sorted(phase for _, phase in old_phases) == sorted(str(phase) for phase in PhaseName)
        assert new_phases == old_phases

        # (2b) Not trusted blindly: the old record is probed (reason UNTRUSTED) and only after that does
        # the new daemon declare the box ready; nothing routes to it in between (routes and readiness
        # read the same trusted records, `WarmBook.trusted` in warmer/service/reconciler/records.py).
        transitions = kinds(new_events, "warm_transition", box_id)
        probes = [e for e in transitions if e["detail"]["reason"].startswith(UNTRUSTED_PROBE)]
        assert len(probes) >= 1, transitions
        probe = probes[0]
        assert (probe["epoch"], probe["prefix_hash"]) == (epoch, stable.hash)
        assert (probe["detail"]["from"], probe["detail"]["to"]) == ("warm", "warm")
        assert transitions[0] is probe  # no warm-up of the prefix from scratch before the probe
        ready = kinds(new_events, "box_ready", box_id)
        assert len(ready) == 1
        assert ready[0]["epoch"] == epoch
        assert probe["id"] < ready[0]["id"]
        # (2c) The first daemon measured this epoch's time to ready; the new one only re-verified it, so
        # its box_ready says resumed and carries no time-to-ready figures (nor reaches those metrics).
        (first_ready,) = kinds(crashed["events"], "box_ready", box_id)
        assert "resumed" not in first_ready["detail"]
        assert first_ready["detail"]["time_to_ready_seconds"] > 0
        assert ready[0]["detail"]["resumed"] is True
        # Measured from the new daemon's own first health check, not from the epoch's start: that would
        # take in the first daemon's time to ready and everything since its ready.
        assert ready[0]["detail"]["reverify_seconds"] < ready[0]["at"] - first_ready["at"]
        assert "time_to_ready_seconds" not in ready[0]["detail"]
        assert views[box_id]["resumed"] is True
        assert views[box_id]["time_to_ready_seconds"] is None
        assert views[box_id]["overhead_fraction"] is None
