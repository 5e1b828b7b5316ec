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
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.fleet import LlamaFleet
from warmer.adapters.store import SqlStore
from warmer.config.agents import load_agent_specs
from warmer.config.profiles import load_profile
from warmer.config.tokenizer import offline_renderer, offline_tokenizer
from warmer.core.agents import AgentSpec, build_request, sample_values
from warmer.core.model import PhaseName
from warmer.core.prefix import StablePrefix, compute_stable_prefix

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
AGENTS_DIR = REPO / "config" / "agents"
MODELS_DIR = REPO / "models"
AGENT = "outbound-sales"
FRESH_CALL = 7  # a sample index the stable-prefix computation never rendered (it uses 0..2)
READY_TIMEOUT_SECONDS = 240.0  # a loaded 2-core machine: bounds, not expectations

FleetFactory = Callable[..., LlamaFleet]


def warmer_script() -> str:
    script = shutil.which("warmer", path=str(Path(sys.executable).parent))
    assert script is not None, "the `warmer` console script is installed next to the interpreter"
    return script


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if not key.startswith("WARMER_")}


def _write_config(tmp_path: Path, fleet: LlamaFleet, port: int) -> Path:
    agents = tmp_path / "agents"
    agents.mkdir()
    shutil.copy(AGENTS_DIR / f"{AGENT}.toml", agents)
    shutil.copy(AGENTS_DIR / f"{AGENT}.tools.json", agents)
    shutil.copytree(AGENTS_DIR / AGENT, agents / AGENT)
    boxes = "\n".join(
        f'[[fleet.boxes]]\nid = "{box.id}"\nbase_url = "{box.base_url}"\nengine = "llamacpp"\n'
        f'model = "tiny-demo"\nslots = 2\n'
        for box in fleet.boxes
    )
    config = tmp_path / "warmer.toml"
    config.write_text(
        f"""
[database]
state_dir = "{tmp_path / "state"}"

[api]
host = "127.0.0.1"
port = {port}

[reconcile]
interval_seconds = 0.5
health_poll_seconds = 0.5
ramp_seconds = 2.0
shutdown_grace_seconds = 5.0

[logging]
format = "json"

[fleet]
models_dir = "{MODELS_DIR}"
agents_dir = "{agents}"

{boxes}
"""
    )
    return config


@pytest.fixture
def daemon(
    llama_fleet_factory: FleetFactory, tmp_path: Path
) -> Iterator[tuple[LlamaFleet, subprocess.Popen[str], str, Path]]:
    fleet = llama_fleet_factory(2, slots=2, ctx_per_slot=4096)
    port = free_port()
    config = _write_config(tmp_path, fleet, port)
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [warmer_script(), "--config", str(config), "serve"],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env=clean_env(),
        )
    try:
        yield fleet, process, f"http://127.0.0.1:{port}", log_path
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def _wait(
    what: str, check: Callable[[], bool], process: subprocess.Popen[str], log: Path, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"serve exited with {process.returncode}:\n{log.read_text()[-5000:]}"
        try:
            if check():
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-5000:]}")


def _routes(base_url: str) -> dict[str, Any]:
    response = httpx.get(f"{base_url}/v1/routes", timeout=10)
    response.raise_for_status()
    routes: dict[str, Any] = response.json()["routes"]
    return routes


def _routed_boxes(base_url: str) -> list[str]:
    return [route["box_id"] for route in _routes(base_url)[AGENT]["routes"]]


def _stable(agent: AgentSpec) -> StablePrefix:
    profile = load_profile(MODELS_DIR / "tiny-demo.toml")
    return compute_stable_prefix(agent, offline_renderer(profile), offline_tokenizer(profile))


def _turn1(base_url: str, agent: AgentSpec) -> dict[str, Any]:
    """A real first turn: the agent's full prompt with fresh per-call values, as the engine renders it."""
    profile = load_profile(MODELS_DIR / "tiny-demo.toml")
    request = build_request(agent, sample_values(agent, FRESH_CALL))
    prompt = offline_renderer(profile)(request.messages, request.tools)
    body = {"prompt": prompt, "n_predict": 1, "temperature": 0, "cache_prompt": True}
    response = httpx.post(f"{base_url}/completion", json=body, timeout=300)
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


def test_daemon_warms_a_real_fleet_routes_only_warm_boxes_and_survives_an_engine_restart(
    daemon: tuple[LlamaFleet, subprocess.Popen[str], str, Path], tmp_path: Path
) -> None:
    fleet, process, base_url, log = daemon
    agent = load_agent_specs(AGENTS_DIR)[AGENT]
    stable = _stable(agent)
    box_ids = [box.id for box in fleet.boxes]
    seen: dict[str, list[int]] = {box_id: [] for box_id in box_ids}

    def all_ready() -> bool:
        for box_id in box_ids:
            status = httpx.get(f"{base_url}/v1/boxes/{box_id}/ready", timeout=10).status_code
            seen[box_id].append(status)
        return all(codes[-1] == 200 for codes in seen.values())

    _wait("both boxes ready", all_ready, process, log, READY_TIMEOUT_SECONDS)
    for box_id, codes in seen.items():
        assert codes[0] == 503, f"{box_id} was ready before its warm-up could have run: {codes}"
        assert codes[-1] == 200

    # Per-agent routes: both boxes, the agent's prefix as computed offline.
    routes = _routes(base_url)[AGENT]
    assert routes["prefix_hash"] == stable.hash
    assert sorted(r["box_id"] for r in routes["routes"]) == sorted(box_ids)

    # A real turn 1 on a routed box reuses the whole stable prefix.
    target = fleet.box(routes["routes"][0]["box_id"])
    turn1 = _turn1(target.base_url, agent)
    assert turn1["timings"]["cache_n"] >= stable.token_count - 1

    box_view = httpx.get(f"{base_url}/v1/boxes/{target.id}", timeout=10).json()
    assert [p["phase"] for p in box_view["phases"]] == [phase.value for phase in PhaseName]
    assert all(p["ok"] for p in box_view["phases"])
    assert box_view["time_to_ready"]["engine_seconds"] > 0

    # The engine restarts: detected, out of the routes, re-warmed, back in.
    restarted = box_ids[0]
    old_epoch = httpx.get(f"{base_url}/v1/boxes/{restarted}", timeout=10).json()["epoch"]
    fleet.restart(restarted)
    _wait("the restarted box to leave the routes", lambda: restarted not in _routed_boxes(base_url),
          process, log, 60.0)  # fmt: skip
    _wait("the restarted box to return to the routes", lambda: restarted in _routed_boxes(base_url),
          process, log, READY_TIMEOUT_SECONDS)  # fmt: skip
    back = httpx.get(f"{base_url}/v1/boxes/{restarted}", timeout=10).json()
    assert back["epoch"] != old_epoch
    assert back["ready"]["ready"] is True
    again = _turn1(fleet.box(restarted).base_url, agent)
    assert again["timings"]["cache_n"] >= stable.token_count - 1

    status_cli = subprocess.run(
        [warmer_script(), "--config", str(tmp_path / "warmer.toml"), "status"],
        capture_output=True, text=True, env=clean_env(), timeout=60, check=False,
    )  # fmt: skip
    assert status_cli.returncode == 0, status_cli.stderr
    assert restarted in status_cli.stdout
    assert AGENT in status_cli.stdout

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0, log.read_text()[-5000:]

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
