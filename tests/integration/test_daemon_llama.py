"""The done-when test of the reconciler: a real `warmer serve` process over two real llama-server boxes.

The daemon runs each box's restart warm-up, warms the agent's stable prefix, and `/v1/boxes/{id}/ready`
flips 503 -> 200; a real turn-1 request (the agent's full prompt with fresh per-call values) sent to a box
from `/v1/routes` is served from the engine's cache (`timings.cache_n`, ggml-org/llama.cpp
tools/server/README.md: "number of prompt tokens reused from cache"); a llama-server restart is detected,
that box leaves the routes, is re-warmed and returns; the SQLite file holds the whole history.

Bounded waits only (no timing assertions): the reconcile interval is short so the test is quick.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.daemon_harness import (
    AGENT,
    AGENTS_DIR,
    FleetFactory,
    LlamaDaemon,
    clean_env,
    llama_daemon,
    stable_prefix,
    turn1,
    warmer_script,
)
from warmer.adapters.store import SqlStore
from warmer.config.agents import load_agent_specs
from warmer.core.model import PhaseName

pytestmark = pytest.mark.integration


@pytest.fixture
def daemon(llama_fleet_factory: FleetFactory, tmp_path: Path) -> Iterator[LlamaDaemon]:
    with llama_daemon(llama_fleet_factory, tmp_path) as started:
        yield started


def test_daemon_warms_a_real_fleet_routes_only_warm_boxes_and_survives_an_engine_restart(
    daemon: LlamaDaemon, tmp_path: Path
) -> None:
    fleet, base_url = daemon.fleet, daemon.base_url
    agent = load_agent_specs(AGENTS_DIR)[AGENT]
    stable = stable_prefix(agent)
    box_ids = [box.id for box in fleet.boxes]
    seen: dict[str, list[int]] = {box_id: [] for box_id in box_ids}

    def all_ready() -> bool:
        for box_id in box_ids:
            seen[box_id].append(daemon.ready_status(box_id))
        return all(codes[-1] == 200 for codes in seen.values())

    daemon.wait("both boxes ready", all_ready)
    for box_id, codes in seen.items():
        assert codes[0] == 503, f"{box_id} was ready before its warm-up could have run: {codes}"
        assert codes[-1] == 200

    # Per-agent routes: both boxes, the agent's prefix as computed offline.
    routes = daemon.routes()[AGENT]
    assert routes["prefix_hash"] == stable.hash
    assert sorted(r["box_id"] for r in routes["routes"]) == sorted(box_ids)

    # A real turn 1 on a routed box reuses the whole stable prefix.
    target = fleet.box(routes["routes"][0]["box_id"])
    first_turn = turn1(target.base_url, agent)
    assert first_turn["timings"]["cache_n"] >= stable.token_count - 1

    box_view = httpx.get(f"{base_url}/v1/boxes/{target.id}", timeout=10).json()
    assert [p["phase"] for p in box_view["phases"]] == [phase.value for phase in PhaseName]
    assert all(p["ok"] for p in box_view["phases"])
    assert box_view["time_to_ready"]["engine_seconds"] > 0

    # The engine restarts: detected, out of the routes, re-warmed, back in.
    restarted = box_ids[0]
    old_epoch = httpx.get(f"{base_url}/v1/boxes/{restarted}", timeout=10).json()["epoch"]
    fleet.restart(restarted)
    daemon.wait("the restarted box to leave the routes", lambda: restarted not in daemon.routed_boxes(), 60.0)
    daemon.wait("the restarted box to return to the routes", lambda: restarted in daemon.routed_boxes())
    back = httpx.get(f"{base_url}/v1/boxes/{restarted}", timeout=10).json()
    assert back["epoch"] != old_epoch
    assert back["ready"]["ready"] is True
    again = turn1(fleet.box(restarted).base_url, agent)
    assert again["timings"]["cache_n"] >= stable.token_count - 1

    status_cli = subprocess.run(
        [warmer_script(), "--config", str(tmp_path / "warmer.toml"), "status"],
        capture_output=True, text=True, env=clean_env(), timeout=60, check=False,
    )  # fmt: skip
    assert status_cli.returncode == 0, status_cli.stderr
    assert restarted in status_cli.stdout
    assert AGENT in status_cli.stdout

    daemon.stop()

    # The database holds the whole history.
    async def history() -> None:
        store = SqlStore.from_url(f"sqlite:///{tmp_path / 'state' / 'warmer.db'}")
        try:
            events = list(reversed(await store.events(limit=10_000)))
            epochs = [e.epoch for e in events if e.kind == "epoch_changed" and e.box_id == restarted]
            assert len(epochs) == 2
            assert epochs[0] == old_epoch
            ready = [e for e in events if e.kind == "box_ready"]
            assert sorted(str(e.box_id) for e in ready) == sorted([*box_ids, restarted])
            for event in ready:
                engine_seconds = event.detail["engine_seconds"]
                assert isinstance(engine_seconds, float)
                assert engine_seconds > 0
            transitions = [e for e in events if e.kind == "warm_transition" and e.box_id == restarted]
            per_epoch = {e.epoch for e in transitions if e.detail["to"] == "warm"}
            assert per_epoch == set(epochs)  # verified warm in the old epoch and again in the new one
            for epoch in epochs:
                assert epoch is not None
                phases = await store.list_phases(restarted, epoch)
                assert [p.phase for p in phases] == list(PhaseName)
        finally:
            await store.close()

    asyncio.run(history())
