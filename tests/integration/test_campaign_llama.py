"""A campaign booked in the near future warms an idle agent from its lead time on, not before, and it is
verified warm and routed before the window opens; a real `warmer serve` over two real llama-server boxes.

The daemon runs with a short idle cut-off (`reconcile.retire_idle_after_seconds`), so the agent is not kept
warm by being assigned: only the campaign (`dialer.campaign_lead_seconds` ahead of its window) warms it.
The restart warm-up of a box takes longer than the idle cut-off here, so the agent is idle by the time its
boxes could hold it. Every check is an ordering against the campaign's own timestamps (the daemon and the
test share the wall clock); waits are bounded, nothing asserts how fast anything is.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from testbed.fleet import LlamaFleet, free_loopback_port
from tests.integration.daemon_harness import (
    AGENT,
    AGENTS_DIR,
    FleetFactory,
    Serve,
    fleet_boxes,
    running_serve,
    stable_prefix,
    turn1_cached_tokens,
    write_config,
)
from warmer.config.agents import load_agent_specs

pytestmark = pytest.mark.integration

TICK_SECONDS = 0.5  # `reconcile.interval_seconds` of the harness config: one reconcile pass
RETIRE_IDLE_SECONDS = 3.0
LEAD_SECONDS = 30.0  # room for cold prefills of the prefix (seconds each here) on a loaded 2-core machine
STARTS_IN_SECONDS = 36.0  # the window opens this long after booking: the lead begins ~6 s after booking
WINDOW_SECONDS = 10.0
SERVING_STATES = {"warm", "stale", "warming"}  # any sign the daemon holds or is warming the prefix


@pytest.fixture
def daemon(llama_fleet_factory: FleetFactory, tmp_path: Path) -> Iterator[tuple[Serve, LlamaFleet, float]]:
    """(serve, fleet, wall time just before serve started) with a short idle cut-off and campaign lead."""
    fleet = llama_fleet_factory(2, slots=2, ctx_per_slot=4096)
    port = free_loopback_port()
    # `sections` lands inside `[reconcile]` first, so the idle cut-off belongs there; then `[dialer]`.
    settings = f"retire_idle_after_seconds = {RETIRE_IDLE_SECONDS}\n\n[dialer]\n"
    settings += f"campaign_lead_seconds = {LEAD_SECONDS}\n"
    config = write_config(tmp_path, fleet_boxes(fleet), port, sections=settings)
    started = time.time()
    with running_serve(config, port, tmp_path / "serve.log") as serve:
        yield serve, fleet, started


def prefix_states(serve: Serve, box_ids: list[str], prefix_hash: str) -> dict[str, str]:
    """Box -> the daemon's state for the prefix there ("absent" when the box lists no record of it)."""
    states: dict[str, str] = {}
    for box_id in box_ids:
        held = [p["state"] for p in serve.box(box_id)["prefixes"] if p["prefix_hash"] == prefix_hash]
        states[box_id] = held[0] if held else "absent"
    return states


def test_idle_agent_is_warmed_for_a_campaign_from_its_lead_time_and_routed_before_the_window(
    daemon: tuple[Serve, LlamaFleet, float],
) -> None:
    serve, fleet, serve_started = daemon
    box_ids = sorted(box.id for box in fleet.boxes)
    agent = load_agent_specs(AGENTS_DIR)[AGENT]
    stable = stable_prefix(agent)

    def idle_everywhere() -> bool:
        """Both boxes past their restart warm-up and ready, the agent known but routed nowhere, its prefix
        neither held nor being warmed, and the idle cut-off long past the daemon's first sight of it."""
        if time.time() < serve_started + RETIRE_IDLE_SECONDS + 2 * TICK_SECONDS:
            return False
        if not all(serve.box(box_id)["warmup"] == "done" and serve.is_ready(box_id) for box_id in box_ids):
            return False
        prefix_hash, routed = serve.agent_routes()
        states = prefix_states(serve, box_ids, stable.hash)
        return prefix_hash == stable.hash and routed == [] and not set(states.values()) & SERVING_STATES

    serve.wait("the agent idle: boxes ready, its prefix not kept warm", idle_everywhere)

    booked = time.time()
    starts_at = booked + STARTS_IN_SECONDS
    ends_at = starts_at + WINDOW_SECONDS
    lead_begins = starts_at - LEAD_SECONDS
    body = {"agent": AGENT, "starts_at": starts_at, "ends_at": ends_at, "expected_calls": 10}
    put = httpx.put(f"{serve.base_url}/v1/campaigns/soon-1", json=body, timeout=10)
    assert put.status_code == 201, put.text

    # Before the lead time begins (less one pass of slack) the campaign must not warm anything.
    quiet_until = lead_begins - TICK_SECONDS
    while time.time() < quiet_until:
        assert serve.process.poll() is None, serve.log_tail()
        states = prefix_states(serve, box_ids, stable.hash)
        routed = serve.agent_routes()[1]
        now = time.time()
        if now < quiet_until:  # the reading was taken before the lead time: nothing may be warm yet
            assert routed == [], f"routed {routed} {lead_begins - now:.1f}s before the lead time"
            assert not set(states.values()) & SERVING_STATES, (
                f"prefix {states} {lead_begins - now:.1f}s before the lead time:\n{serve.log_tail()}"
            )
        time.sleep(0.2)

    # From the lead time on, the prefix is verified warm and routed on both boxes before the window opens.
    serve.wait("the agent routed on both boxes", lambda: serve.agent_routes()[1] == box_ids, 120.0)
    routed_at = time.time()
    assert routed_at < starts_at, (
        f"the route appeared {routed_at - starts_at:.1f}s after the window opened:\n{serve.log_tail()}"
    )
    assert set(prefix_states(serve, box_ids, stable.hash).values()) == {"warm"}

    # During the window a real first turn on a routed box reuses the whole stable prefix.
    serve.wait("the campaign window open", lambda: time.time() >= starts_at, STARTS_IN_SECONDS + 5.0)
    first_box = serve.routed_boxes()[0]
    base_url = next(box.base_url for box in fleet.boxes if box.id == first_box)
    assert time.time() < ends_at
    assert turn1_cached_tokens(base_url, agent) >= stable.token_count - 1

    # After the window, with no traffic seen, the idle agent is released again.
    serve.wait("the window closed", lambda: time.time() >= ends_at, WINDOW_SECONDS + 5.0)

    def released() -> bool:
        states = prefix_states(serve, box_ids, stable.hash)
        return serve.agent_routes()[1] == [] and not set(states.values()) & SERVING_STATES

    serve.wait("the agent released after the window", released, 60.0)
