"""What the fleet benchmark showed, guarded on real llama-server boxes (mechanisms, not timings).

Three boxes with two slots each hold six prompts at once (llama.cpp keeps one prompt per slot, `--cache-ram
0`). warmer reads that from each engine, gives every one of six agents one box instead of twelve
memberships on six slots, pins each prefix to a slot of its own, and answers pre-call asks with that slot:
a turn 1 sent there finds the whole stable prefix cached, for every agent, again after every other agent's
turn 1. A box restarted without any webhook hands its agents to boxes where they are warmed first, and
gets them back after its own warm-up. With room for an agent on two boxes, pre-call answers spread over
both.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.fleet import free_loopback_port
from tests.integration.daemon_harness import (
    FRESH_CALL,
    MODEL,
    MODELS_DIR,
    FleetFactory,
    fleet_boxes,
    running_serve,
    write_config,
)
from warmer.config.agents import load_agent_spec
from warmer.config.profiles import load_profile
from warmer.config.tokenizer import offline_renderer, offline_tokenizer
from warmer.core.agent_requests import build_request, sample_values
from warmer.core.agents import AgentSpec
from warmer.core.prefix import compute_stable_prefix

pytestmark = pytest.mark.integration

AGENTS = [f"agent-{i}" for i in range(6)]
WAIT_SECONDS = 240.0  # a loaded 2-core machine: bounds, not expectations


def write_agents(directory: Path, names: list[str]) -> dict[str, AgentSpec]:
    """Agents whose prompts differ from their first line on (~900 stable tokens each)."""
    shutil.rmtree(directory)
    directory.mkdir()
    rules = "\n".join(f"Rule {n}: keep the caller's time in mind and answer briefly." for n in range(12))
    for name in names:
        (directory / f"{name}.toml").write_text(
            f'model = "{MODEL}"\n\n[[blocks]]\nname = "persona"\n'
            f'text = """You are {name}, a phone agent for Northwind Mobile.\n{rules}"""\n\n'
            '[dynamic]\nrole = "user"\ntemplate = """Customer: {customer_name}\nCall id: {call_id}"""\n\n'
            '[placeholders]\ncustomer_name = "name"\ncall_id = "uuid"\n'
        )
    return {name: load_agent_spec(directory / f"{name}.toml") for name in names}


def prompt_and_prefix(agent: AgentSpec) -> tuple[str, int]:
    """A real turn 1 (fresh per-call values) as the engine renders it, and the agent's stable tokens."""
    profile = load_profile(MODELS_DIR / f"{MODEL}.toml")
    render = offline_renderer(profile)
    stable = compute_stable_prefix(agent, render, offline_tokenizer(profile))
    request = build_request(agent, sample_values(agent, FRESH_CALL))
    return render(request.messages, request.tools), stable.token_count


def wait_for(what: str, check: Any, log: Path, timeout: float = WAIT_SECONDS) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except httpx.HTTPError:  # the daemon is still starting
            value = None
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}\n{log.read_text()[-4000:]}")


def routes(base_url: str) -> dict[str, list[str]]:
    body = httpx.get(f"{base_url}/v1/routes", timeout=10).json()["routes"]
    return {agent: [r["box_id"] for r in entry["routes"]] for agent, entry in body.items()}


def ask(base_url: str, agent: str, call_id: str) -> dict[str, Any]:
    response = httpx.post(
        f"{base_url}/v1/prewarm", json={"agent": agent, "call_id": call_id, "wait_ms": 5000}, timeout=30
    )
    response.raise_for_status()
    answer: dict[str, Any] = response.json()
    return answer


def turn1_cached(answer: dict[str, Any], prompt: str) -> int:
    """Send turn 1 where the answer says, in the slot it names (llama-server `id_slot`)."""
    body: dict[str, Any] = {"prompt": prompt, "n_predict": 1, "temperature": 0, "cache_prompt": True}
    if answer.get("slot") is not None:
        body["id_slot"] = answer["slot"]
    response = httpx.post(f"{answer['base_url']}/completion", json=body, timeout=300)
    response.raise_for_status()
    return int(response.json()["timings"]["cache_n"])


def test_six_agents_on_six_slots_are_each_warm_on_one_box_and_a_restart_moves_them_warm(
    llama_fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    fleet = llama_fleet_factory(3, slots=2, ctx_per_slot=2048)
    port = free_loopback_port()
    config = write_config(tmp_path, fleet_boxes(fleet), port)
    specs = write_agents(tmp_path / "agents", AGENTS)
    turns = {name: prompt_and_prefix(spec) for name, spec in specs.items()}
    with running_serve(config, port, tmp_path / "serve.log") as daemon:
        url, log = daemon.base_url, daemon.log

        def all_routed() -> dict[str, list[str]] | None:
            found = routes(url)
            return found if all(found.get(a) for a in AGENTS) else None

        placed = wait_for("every agent routed", all_routed, log)
        assert all(len(placed[a]) == 1 for a in AGENTS), placed  # 12 memberships would not fit 6 slots
        assert max(Counter(b for a in AGENTS for b in placed[a]).values()) == 2

        for round_no in range(2):  # the second round: every other agent's turn 1 evicted nothing
            for name in AGENTS:
                answer = ask(url, name, f"call-{round_no}-{name}")
                assert answer["ready"] is True, answer
                assert answer["state"] == "warm", answer
                prompt, stable = turns[name]
                cached = turn1_cached(answer, prompt)
                assert cached >= 0.99 * stable, (round_no, name, answer, cached, stable)

        rolled = placed[AGENTS[0]][0]
        moved = [a for a in AGENTS if placed[a] == [rolled]]
        for name in moved:  # the rolled box's agents are the busy ones: they keep a warm box
            for extra in range(8):
                ask(url, name, f"busy-{extra}-{name}")
        fleet.restart(rolled)  # no webhook: warmer sees the new epoch itself

        def moved_elsewhere() -> dict[str, list[str]] | None:
            found = routes(url)
            return found if all(found.get(a) and rolled not in found[a] for a in moved) else None

        during = wait_for(f"{moved} routed to other boxes while {rolled} warms up", moved_elsewhere, log)
        for name in moved:  # the stand-in really holds it (it may already be handing back to `rolled`)
            stand_in = {"base_url": fleet.box(during[name][0]).base_url}
            assert turn1_cached(stand_in, turns[name][0]) >= 0.99 * turns[name][1], (name, during)
        wait_for(f"every agent routed again once {rolled} is warm", all_routed, log)
        wait_for(f"{rolled} serving again", lambda: any(rolled in r for r in routes(url).values()), log)
        for name in AGENTS:
            answer = ask(url, name, f"after-{name}")
            assert answer["ready"] is True, answer
            assert turn1_cached(answer, turns[name][0]) >= 0.99 * turns[name][1], (name, answer)


def test_pre_call_answers_spread_over_the_agents_warm_boxes(
    llama_fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    fleet = llama_fleet_factory(2, slots=2, ctx_per_slot=2048)
    port = free_loopback_port()
    config = write_config(tmp_path, fleet_boxes(fleet), port)
    specs = write_agents(tmp_path / "agents", ["solo"])
    prompt, stable = prompt_and_prefix(specs["solo"])
    with running_serve(config, port, tmp_path / "serve.log") as daemon:
        url = daemon.base_url
        wait_for("solo warm on both boxes", lambda: len(routes(url).get("solo", [])) == 2, daemon.log)
        time.sleep(2.5)  # past the ramp (2 s): both boxes at full weight
        answers = [ask(url, "solo", f"c{i}") for i in range(20)]
        spread = Counter(a["box_id"] for a in answers)
        assert sorted(spread.values()) == [10, 10], spread  # by load: an even split, not by chance
        assert ask(url, "solo", "c3")["box_id"] == answers[3]["box_id"]  # a call keeps its box
        for answer in answers[:2]:
            assert turn1_cached(answer, prompt) >= 0.99 * stable
