"""Dialer front doors against a real `warmer serve` process over two real llama-server boxes.

Uses the shared daemon harness (`daemon_harness`): a campaign booked ~3 s ahead is stored,
listed, and its agent's prefix is verified warm on its boxes before the window opens; a burst of concurrent
`POST /v1/prewarm` asks (bearer token) all get a routed box serving a warm prefix, the same box for the same
call id, and the engine itself reports the whole stable prefix reused by a real turn-1 request there.
Bounded waits only, no timing assertions.
"""

from __future__ import annotations

import asyncio
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
    turn1,
)
from warmer.config.agents import load_agent_specs

pytestmark = pytest.mark.integration


@pytest.fixture
def daemon(llama_fleet_factory: FleetFactory, tmp_path: Path) -> Iterator[LlamaDaemon]:
    with llama_daemon(llama_fleet_factory, tmp_path) as started:
        yield started


def routed(daemon: LlamaDaemon) -> list[str]:
    """The agent's routed boxes, sorted; none before the daemon's first pass lists the agent."""
    return daemon.agent_routes()[1]


def test_campaign_is_warm_before_its_window_and_prewarm_bursts_get_warm_boxes(daemon: LlamaDaemon) -> None:
    base_url = daemon.base_url
    box_ids = sorted(box.id for box in daemon.fleet.boxes)
    daemon.wait("the agent routed on both boxes", lambda: routed(daemon) == box_ids)

    starts = time.time() + 3.0
    body = {"agent": AGENT, "starts_at": starts, "ends_at": starts + 60.0, "expected_calls": 30}
    put = httpx.put(f"{base_url}/v1/campaigns/soon-1", json=body, timeout=10)
    assert put.status_code == 201, put.text
    assert httpx.put(f"{base_url}/v1/campaigns/soon-1", json=body, timeout=10).status_code == 200
    bad = httpx.put(f"{base_url}/v1/campaigns/soon-2", json=body | {"agent": "nobody"}, timeout=10)
    assert bad.status_code == 404
    listed = httpx.get(f"{base_url}/v1/campaigns", timeout=10).json()["campaigns"]
    assert [c["id"] for c in listed] == ["soon-1"]
    assert time.time() < starts  # still before the window: the prefix is already verified warm
    assert routed(daemon) == box_ids

    async def burst() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
            asks = [
                client.post(
                    "/v1/prewarm", json={"agent": AGENT, "call_id": f"call-{i % 20}", "wait_ms": 5000}
                )
                for i in range(200)
            ]
            responses = await asyncio.gather(*asks)
        assert {r.status_code for r in responses} == {200}
        return [r.json() for r in responses]

    def full_weight() -> bool:  # past the ramp: weights stop changing, so a call's box is stable
        return all(r["weight"] >= 1.0 for r in daemon.routes()[AGENT]["routes"])

    daemon.wait("the routes past their ramp", full_weight, 60.0)
    answers = asyncio.run(burst())
    assert {a["state"] for a in answers} == {"warm"}
    assert {a["ready"] for a in answers} == {True}
    by_call: dict[str, set[str]] = {}
    for index, answer in enumerate(answers):
        by_call.setdefault(f"call-{index % 20}", set()).add(answer["box_id"])
    assert all(len(boxes) == 1 for boxes in by_call.values())  # one call, one box
    agent = load_agent_specs(AGENTS_DIR)[AGENT]
    stable = stable_prefix(agent)
    assert {a["prefix_hash"] for a in answers} == {stable.hash}
    chosen = answers[0]
    first_turn = turn1(chosen["base_url"], agent)
    assert first_turn["timings"]["cache_n"] >= stable.token_count - 1  # the engine reused the whole prefix

    unknown = httpx.post(f"{base_url}/v1/prewarm", json={"agent": "nobody"}, timeout=10)
    assert unknown.status_code == 404
    invalid = httpx.post(f"{base_url}/v1/prewarm", json={"agent": AGENT, "wait_ms": -1}, timeout=10)
    assert invalid.status_code == 422
    assert invalid.json()["field"] == "wait_ms"
    assert httpx.delete(f"{base_url}/v1/campaigns/soon-1", timeout=10).status_code == 204
