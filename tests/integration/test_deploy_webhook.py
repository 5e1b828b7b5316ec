"""The deploy webhook's done-when test: a real `warmer serve` process over two real llama-server boxes.

1. A signed `agent.prompt_changed` event: the new stable prefix is verified warm on the agent's boxes before
   `/v1/routes` switches to it. While polling, whenever the routes name the NEW hash, the engine itself is
   asked at once (a real turn-1 request on each routed box) and must report the new prefix as cached
   (`timings.cache_n`, ggml-org/llama.cpp tools/server/README.md: "number of prompt tokens reused from
   cache"); before the switch the routes keep serving the old prefix on both boxes (no gap).
2. Forged, stale and replayed deliveries are rejected (401, or 200 `duplicate` for a repeated id) and change
   nothing: same routes, same epochs, no drain.
3. `rollout.started` drains a box: its agents are served by their other warm box, it leaves the routes and
   reads "drained"; the llama-server process restarts; the box stays out until `rollout.finished`, then
   comes back as a new epoch after its restart warm-up, warm.

Bounded waits only, no timing assertions.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.daemon_harness import (
    AGENT,
    AGENTS_DIR,
    FleetFactory,
    LlamaDaemon,
    llama_daemon,
    stable_prefix,
    turn1_cached_tokens,
)
from warmer.config.agents import agent_spec_from_data, load_agent_specs
from warmer.core.agents import AgentSpec
from warmer.core.webhook import SIGNATURE_HEADER, sign_body

pytestmark = pytest.mark.integration

SECRET = "integration-webhook-secret"
WEBHOOK_API = f'webhook_secret = "{SECRET}"\nwebhook_tolerance_seconds = 300\n'


@pytest.fixture
def daemon(llama_fleet_factory: FleetFactory, tmp_path: Path) -> Iterator[LlamaDaemon]:
    with llama_daemon(llama_fleet_factory, tmp_path, api_extra=WEBHOOK_API) as started:
        yield started


def post(daemon: LlamaDaemon, body: bytes, signature: str | None) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if signature is not None:
        headers[SIGNATURE_HEADER] = signature
    return httpx.post(f"{daemon.base_url}/v1/events/deploy", content=body, headers=headers, timeout=30)


def send(
    daemon: LlamaDaemon, event: dict[str, Any], *, age: float = 0.0, secret: str = SECRET
) -> httpx.Response:
    body = json.dumps(event).encode()
    return post(daemon, body, sign_body(body, secret, int(time.time() - age)))


def inline_spec(agent: AgentSpec) -> dict[str, Any]:
    """The agent's spec as a deploy event carries it: every text inline (events never name files)."""
    data: dict[str, Any] = {
        "model": agent.model,
        "block_separator": agent.block_separator,
        "blocks": [{"name": block.name, "text": block.text} for block in agent.blocks],
        "dynamic": {
            "template": agent.tail.template,
            "role": agent.tail.role,
            "placement": agent.tail.placement,
        },
        "placeholders": {p.name: p.kind for p in agent.placeholders},
    }
    if agent.tools:
        data["tools"] = [dict(tool) for tool in agent.tools]
    if agent.few_shot:
        data["few_shot"] = [{"role": m.role, "content": m.content} for m in agent.few_shot]
    samples = {p.name: list(p.samples) for p in agent.placeholders if p.samples}
    if samples:
        data["samples"] = samples
    return data


def event(kind: str, event_id: str, **fields: Any) -> dict[str, Any]:
    return {"id": event_id, "kind": kind, "occurred_at": time.time(), **fields}


def test_signed_deploy_events_on_a_real_daemon_and_fleet(daemon: LlamaDaemon) -> None:
    box_ids = sorted(box.id for box in daemon.fleet.boxes)
    old_agent = load_agent_specs(AGENTS_DIR)[AGENT]
    old = stable_prefix(old_agent)
    daemon.wait("both boxes routed for the agent", lambda: daemon.agent_routes() == (old.hash, box_ids))

    # ---- 1. a prompt change: warm on the agent's boxes first, then the routes switch ----------------
    spec = inline_spec(old_agent)
    spec["blocks"][0]["text"] = (
        "Policy update: confirm the callback number first.\n" + spec["blocks"][0]["text"]
    )
    new_agent = agent_spec_from_data(spec, default_id=AGENT, base=None, source="test")
    new = stable_prefix(new_agent)
    assert new.hash != old.hash

    change = event("agent.prompt_changed", "prompt-1", agent_id=AGENT, spec=spec)
    change_body = json.dumps(change).encode()
    change_signature = sign_body(change_body, SECRET, int(time.time()))
    accepted = post(daemon, change_body, change_signature)
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["event_id"] == "prompt-1"

    seen_before_switch: list[tuple[str, list[str]]] = []
    checked_on_engine: dict[str, int] = {}

    def switched() -> bool:
        prefix_hash, routed = daemon.agent_routes()
        if prefix_hash == old.hash:
            seen_before_switch.append((prefix_hash, routed))
            return False
        assert prefix_hash == new.hash
        for box_id in routed:  # routes name the new prefix: the engine must already hold it
            if box_id not in checked_on_engine:
                checked_on_engine[box_id] = turn1_cached_tokens(daemon.fleet.box(box_id).base_url, new_agent)
        return routed == box_ids

    daemon.wait("the routes to switch to the new prefix on both boxes", switched)
    assert seen_before_switch, "the switch happened before the first poll: the ordering was not observed"
    assert all(routed == box_ids for _, routed in seen_before_switch), "the agent lost a route mid-change"
    assert sorted(checked_on_engine) == box_ids
    for box_id, cached in checked_on_engine.items():
        assert cached >= new.token_count - 1, f"{box_id}: new prefix routed but not cached ({cached})"

    def old_retired() -> bool:
        for box_id in box_ids:
            states = {p["prefix_hash"]: p["state"] for p in daemon.box(box_id)["prefixes"]}
            if states.get(old.hash, "cold") != "cold" or states.get(new.hash) != "warm":
                return False
        return True

    daemon.wait("the old prefix to be retired on both boxes", old_retired, 60.0)

    # ---- 2. forged, stale and replayed deliveries change nothing --------------------------------------
    epochs = {box_id: daemon.box(box_id)["epoch"] for box_id in box_ids}
    drain_all = event("rollout.started", "evil-1", box_ids=box_ids)
    drain_body = json.dumps(drain_all).encode()
    forged = post(daemon, drain_body, sign_body(drain_body, "not-the-secret", int(time.time())))
    stale = post(daemon, drain_body, sign_body(drain_body, SECRET, int(time.time()) - 400))
    unsigned = post(daemon, drain_body, None)
    assert [r.status_code for r in (forged, stale, unsigned)] == [401, 401, 401]
    assert [r.json()["outcome"] for r in (forged, stale, unsigned)] == ["forged", "stale", "unsigned"]
    replayed = post(daemon, change_body, change_signature)  # the accepted prompt change, byte for byte
    assert replayed.status_code == 200
    assert replayed.json()["duplicate"] is True
    time.sleep(1.5)  # three reconcile intervals: a change, had there been one, would show
    assert daemon.agent_routes() == (new.hash, box_ids)
    assert {box_id: daemon.box(box_id)["epoch"] for box_id in box_ids} == epochs

    # ---- 3. a rollout: out at once, restarted, back warm as a new epoch ---------------------------------
    rolled = box_ids[0]
    started = send(daemon, event("rollout.started", "roll-1", box_ids=[rolled]))
    assert started.status_code == 202, started.text
    # the agent is warm on the other box already: the rolled box leaves its route within a pass, and its
    # readiness says it is drained (what a pipeline waits for before restarting it)
    daemon.wait("the rolled box to drain", lambda: daemon.agent_routes() == (new.hash, [box_ids[1]]), 10.0)
    ready = httpx.get(f"{daemon.base_url}/v1/boxes/{rolled}/ready", timeout=10)
    assert ready.status_code == 503
    assert "drained for a rollout" in ready.text
    daemon.fleet.restart(rolled)
    time.sleep(1.5)  # the engine is healthy again, but the rollout is not finished: it stays out
    assert daemon.agent_routes() == (new.hash, [box_ids[1]])

    finished = send(daemon, event("rollout.finished", "roll-2", box_ids=[rolled]))
    assert finished.status_code == 202, finished.text
    daemon.wait(
        "the rolled box to return to the routes", lambda: daemon.agent_routes() == (new.hash, box_ids)
    )
    back = daemon.box(rolled)
    assert back["epoch"] != epochs[rolled]
    assert "~rollout-" in back["epoch"]
    assert back["ready"]["ready"] is True
    assert next(p["phase"] for p in back["phases"]) == "sampled"  # the restart warm-up ran in the new epoch
    assert turn1_cached_tokens(daemon.fleet.box(rolled).base_url, new_agent) >= new.token_count - 1
