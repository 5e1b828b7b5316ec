"""A real `warmer serve` over 50 simulated llama.cpp boxes (testbed/simfleet, one process, boxes under
`/box/{index}` base URLs): every box becomes ready, a box routed for the agent turns ready only once the sim
box holds the agent's stable prefix, and a sim restart takes the box out until it is warmed again.

Bounded waits only (no timing assertions): the reconcile and health intervals are short so it is quick.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import pytest

from testbed.fleet import free_loopback_port
from testbed.simfleet import BoxConfig, SimEngine, running_simfleet
from tests.integration.daemon_harness import AGENT, AGENTS_DIR, running_serve, stable_prefix, write_config
from warmer.config.agents import load_agent_specs
from warmer.config.fleet_settings import BoxSettings
from warmer.core.model import EngineKind

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

BOXES = 50


def test_serve_warms_fifty_sim_boxes_and_a_sim_restart_unreadies_one_until_rewarmed(tmp_path: Path) -> None:
    prefix = stable_prefix(load_agent_specs(AGENTS_DIR)[AGENT])
    held_floor = prefix.token_count - 1  # llama.cpp recomputes the last prompt token
    config = BoxConfig(engine=SimEngine.LLAMACPP, slots=2, context_tokens=4096, cache_tokens=8192)
    with running_simfleet(BOXES, config) as fleet:
        index = {box["id"]: i for i, box in enumerate(fleet.boxes)}
        port = free_loopback_port()
        settings = write_config(tmp_path, [(b["id"], b["base_url"]) for b in fleet.boxes], port)
        with running_serve(settings, port, tmp_path / "serve.log") as serve:
            first_status: dict[str, int] = {}
            held_when_ready: dict[str, int] = {}

            def every_box_ready() -> bool:
                for box_id, i in index.items():
                    if box_id in held_when_ready:
                        continue
                    status = serve.ready_status(box_id)
                    first_status.setdefault(box_id, status)
                    if status == 200:  # what the sim box held when warmer first called it ready
                        held_when_ready[box_id] = fleet.cached_tokens(i, prefix.token_ids)
                return len(held_when_ready) == BOXES

            serve.wait("every sim box ready", every_box_ready)
            assert set(first_status.values()) == {503}, "a box was ready before its warm-up could run"
            routed = serve.routed_boxes()
            assert routed, "the agent is routed to no box"
            for box_id in routed:
                assert held_when_ready[box_id] >= held_floor, f"{box_id} was ready without the prefix held"

            target = routed[0]
            old_epoch = fleet.box_state(index[target])["epoch"]
            fleet.restart([index[target]])
            assert fleet.cached_tokens(index[target], prefix.token_ids) == 0
            serve.wait("the restarted box to be not ready", lambda: not serve.is_ready(target), 60.0)
            serve.wait("the restarted box to be ready again", lambda: serve.is_ready(target), 60.0)
            # Ready again means it holds what it is assigned; placement may have moved the agent to another
            # box meanwhile (a restarted box hands its agents over while its warm-up runs), so what must
            # hold is: every box the agent is routed to holds its prefix, the restarted one included.
            for box_id in serve.routed_boxes():
                assert fleet.cached_tokens(index[box_id], prefix.token_ids) >= held_floor, box_id
            assert fleet.box_state(index[target])["epoch"] != old_epoch

            counts = fleet.stats()["boxes"][target]
            assert counts["control"] > 0
            assert counts["work"] > 0
            serve.stop()


def test_cli_spreads_boxes_over_processes_writes_a_fleet_file_warmer_accepts_and_stops_them(
    tmp_path: Path,
) -> None:
    fleet_file = tmp_path / "boxes.toml"
    command = [sys.executable, "-m", "testbed", "simfleet", "--boxes", "5", "--processes", "2"]
    command += ["--engine", "sglang", "--fleet-file", str(fleet_file)]
    cli = subprocess.Popen(command, cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        assert cli.stderr is not None
        said = cli.stderr.readline()  # printed once every process listens and the file is written
        assert "5 simulated sglang box(es)" in said, said
        boxes = [BoxSettings(**entry) for entry in tomllib.loads(fleet_file.read_text())["fleet"]["boxes"]]
        assert [box.id for box in boxes] == [f"sim-{i}" for i in range(5)]
        assert {box.engine for box in boxes} == {EngineKind.SGLANG}
        origins = {box.base_url.rsplit("/box/", 1)[0] for box in boxes}
        assert len(origins) == 2  # two processes, one port each
        for i, box in enumerate(boxes):
            info = httpx.get(f"{box.base_url}/server_info", timeout=10)
            assert info.status_code == 200
            state = httpx.get(f"{box.base_url.rsplit('/box/', 1)[0]}/_sim/box/{i}", timeout=10).json()
            assert state["id"] == box.id
    finally:
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=30) == 0
    for origin in origins:
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{origin}/_sim/fleet", timeout=5)
