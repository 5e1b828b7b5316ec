"""A real `warmer serve` subprocess for integration tests: its config file, its lifetime, bounded waits,
the `/v1/routes` and `/v1/boxes` views, and real turn-1 requests against the llama-server boxes it warms.

Shared so every daemon-level test writes the same config and waits the same way; a test adds only what is
its own (webhook secret, gateway section) through the `write_config` keywords.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from testbed.fleet import LlamaFleet, free_loopback_port
from warmer.config.profiles import load_profile
from warmer.config.tokenizer import offline_renderer, offline_tokenizer
from warmer.core.agent_requests import build_request, sample_values
from warmer.core.agents import AgentSpec
from warmer.core.prefix import StablePrefix, compute_stable_prefix

REPO = Path(__file__).resolve().parents[2]
AGENTS_DIR = REPO / "config" / "agents"
MODELS_DIR = REPO / "models"
AGENT = "outbound-sales"
MODEL = "tiny-demo"
FRESH_CALL = 7  # a sample index the stable-prefix computation never rendered (it uses 0..2)
READY_TIMEOUT_SECONDS = 240.0  # a loaded 2-core machine: bounds, not expectations
LOG_TAIL_CHARS = 5000

FleetFactory = Callable[..., LlamaFleet]


def warmer_script() -> str:
    script = shutil.which("warmer", path=str(Path(sys.executable).parent))
    assert script is not None, "the `warmer` console script is installed next to the interpreter"
    return script


def clean_env(**overrides: str) -> dict[str, str]:
    """The caller's environment without WARMER_* (so only the config file speaks), plus `overrides`."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("WARMER_")}
    env.update(overrides)
    return env


def write_config(
    tmp_path: Path,
    boxes: Iterable[tuple[str, str]],
    port: int,
    *,
    api_extra: str = "",
    sections: str = "",
    fleet_extra: str = "",
    models_dir: Path = MODELS_DIR,
    model: str = MODEL,
) -> Path:
    """A warmer.toml for llama-server boxes `(id, base_url)` and a private copy of the test agent.

    `api_extra` adds lines to `[api]`, `sections` adds whole sections after `[reconcile]`, `fleet_extra`
    adds sub-tables of `[fleet]` (e.g. `[fleet.gateway]`, or boxes of another engine) before the boxes.
    `model`: the agent's model profile (one of `models_dir`).
    """
    agents = tmp_path / "agents"
    agents.mkdir()
    spec = (AGENTS_DIR / f"{AGENT}.toml").read_text()
    (agents / f"{AGENT}.toml").write_text(spec.replace(f'model = "{MODEL}"', f'model = "{model}"'))
    shutil.copy(AGENTS_DIR / f"{AGENT}.tools.json", agents)
    shutil.copytree(AGENTS_DIR / AGENT, agents / AGENT)
    box_tables = "\n".join(
        f'[[fleet.boxes]]\nid = "{box_id}"\nbase_url = "{base_url}"\nengine = "llamacpp"\n'
        f'model = "{MODEL}"\nslots = 2\n'
        for box_id, base_url in boxes
    )
    config = tmp_path / "warmer.toml"
    config.write_text(
        f"""
[database]
state_dir = "{tmp_path / "state"}"

[api]
host = "127.0.0.1"
port = {port}
{api_extra}
[reconcile]
interval_seconds = 0.5
health_poll_seconds = 0.5
ramp_seconds = 2.0
shutdown_grace_seconds = 5.0
{sections}
[logging]
format = "json"

[fleet]
models_dir = "{models_dir}"
agents_dir = "{agents}"
{fleet_extra}
{box_tables}
"""
    )
    return config


def fleet_boxes(fleet: LlamaFleet) -> list[tuple[str, str]]:
    return [(box.id, box.base_url) for box in fleet.boxes]


@dataclass
class Serve:
    """A running `warmer serve` process, its API URL and its log file."""

    process: subprocess.Popen[str]
    base_url: str
    log: Path

    def log_tail(self) -> str:
        return self.log.read_text()[-LOG_TAIL_CHARS:]

    def wait(self, what: str, check: Callable[[], bool], timeout: float = READY_TIMEOUT_SECONDS) -> None:
        """Poll `check` until true; fails at once if serve exits, and with the log tail on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (
                f"serve exited with {self.process.returncode}:\n{self.log_tail()}"
            )
            try:
                if check():
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}:\n{self.log_tail()}")

    def routes(self) -> dict[str, Any]:
        """Every agent's entry of `/v1/routes`."""
        response = httpx.get(f"{self.base_url}/v1/routes", timeout=10)
        response.raise_for_status()
        routes: dict[str, Any] = response.json()["routes"]
        return routes

    def routed_boxes(self, agent: str = AGENT) -> list[str]:
        """The agent's routed boxes in route order; a KeyError if the routes do not list the agent."""
        return [route["box_id"] for route in self.routes()[agent]["routes"]]

    def agent_routes(self, agent: str = AGENT) -> tuple[str, list[str]]:
        """(the agent's current prefix hash, its routed boxes sorted); ("", []) before a pass lists it."""
        entry = self.routes().get(agent)
        if entry is None:
            return "", []
        return entry["prefix_hash"], sorted(route["box_id"] for route in entry["routes"])

    def box(self, box_id: str) -> dict[str, Any]:
        response = httpx.get(f"{self.base_url}/v1/boxes/{box_id}", timeout=10)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def ready_status(self, box_id: str) -> int:
        return httpx.get(f"{self.base_url}/v1/boxes/{box_id}/ready", timeout=10).status_code

    def is_ready(self, box_id: str) -> bool:
        return self.ready_status(box_id) == 200

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM, and the process must exit 0 within `timeout`."""
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=timeout) == 0, self.log_tail()


@contextmanager
def running_serve(
    config: Path, port: int, log_path: Path, env: dict[str, str] | None = None
) -> Iterator[Serve]:
    """`warmer --config CONFIG serve` with its output in `log_path`; killed at exit if still running."""
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [warmer_script(), "--config", str(config), "serve"],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env=clean_env() if env is None else env,
        )
    try:
        yield Serve(process, f"http://127.0.0.1:{port}", log_path)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


@dataclass
class LlamaDaemon(Serve):
    """`warmer serve` over a real llama-server fleet."""

    fleet: LlamaFleet


@contextmanager
def llama_daemon(
    llama_fleet_factory: FleetFactory, tmp_path: Path, *, api_extra: str = ""
) -> Iterator[LlamaDaemon]:
    """Two llama-server boxes (2 slots, 4096 tokens each) and a `warmer serve` warming them."""
    fleet = llama_fleet_factory(2, slots=2, ctx_per_slot=4096)
    port = free_loopback_port()
    config = write_config(tmp_path, fleet_boxes(fleet), port, api_extra=api_extra)
    with running_serve(config, port, tmp_path / "serve.log") as serve:
        yield LlamaDaemon(serve.process, serve.base_url, serve.log, fleet)


def stable_prefix(agent: AgentSpec) -> StablePrefix:
    """The agent's stable prefix as computed offline for the tiny-demo model."""
    profile = load_profile(MODELS_DIR / f"{MODEL}.toml")
    return compute_stable_prefix(agent, offline_renderer(profile), offline_tokenizer(profile))


def turn1(box_url: str, agent: AgentSpec) -> dict[str, Any]:
    """A real first turn: the agent's full prompt with fresh per-call values, as the engine renders it."""
    profile = load_profile(MODELS_DIR / f"{MODEL}.toml")
    request = build_request(agent, sample_values(agent, FRESH_CALL))
    prompt = offline_renderer(profile)(request.messages, request.tools)
    body = {"prompt": prompt, "n_predict": 1, "temperature": 0, "cache_prompt": True}
    response = httpx.post(f"{box_url}/completion", json=body, timeout=300)
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


def turn1_cached_tokens(box_url: str, agent: AgentSpec) -> int:
    """Tokens of a real first turn the engine reused from its cache (`timings.cache_n`)."""
    return int(turn1(box_url, agent)["timings"]["cache_n"])


# Capacity runs (the integration test and bench.capacity_headroom): the engine's counters are scraped often,
# and usage that old still counts, so headroom follows load within a few seconds.
CAPACITY_POLL_SECONDS = 2.0
CAPACITY_SECTIONS = f"""
[hitrate]
poll_seconds = {CAPACITY_POLL_SECONDS}
threshold = 0.0

[capacity]
max_usage_age_seconds = 10.0
"""
# No spaces: about one token per character in the tiny model's byte vocabulary.
_FILLER = "load-0123456789|abcdefghij/KLMNOPQRST;"


def fresh_prompt(chars: int) -> str:
    """A prompt of `chars` characters no earlier one shares beyond BOS (a fresh first character)."""
    head = uuid.uuid4().hex
    return (head + _FILLER * (chars // len(_FILLER) + 1))[:chars]
