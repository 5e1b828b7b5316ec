"""The pre-call route lookup observes only the agent's own group, and must give exactly the routes the
full computation over the whole fleet gives (`snapshot().routes()`), through every state a box passes:
warm and ramping, down, restarted into a new epoch, drained for a rollout, back."""

from __future__ import annotations

import asyncio

from tests.unit.reconciler_fakes import World, settle, world
from warmer.core.planner import PlannerConfig, WarmBudget

AGENTS = ("sales", "support", "billing")


def same_routes(w: World) -> None:
    snapshot = w.reconciler.snapshot().routes()
    for agent_id in AGENTS:
        assert w.reconciler.agent_routes(agent_id) == snapshot.get(agent_id, ()), agent_id


def test_one_agents_routes_match_the_fleet_wide_computation_in_every_box_state(store_url: str) -> None:
    async def scenario() -> None:
        planner = PlannerConfig(budget=WarmBudget(max_concurrent=2, tokens_per_second=1e6), ramp_seconds=30.0)
        w = world(store_url, box_ids=("b1", "b2", "b3", "b4"), agents=AGENTS, planner=planner)
        same_routes(w)  # before the first pass: no routes anywhere
        await settle(w.reconciler)
        assert any(w.reconciler.agent_routes(a) for a in AGENTS)
        same_routes(w)  # warm, still ramping
        w.clock.t += 10.0
        same_routes(w)
        w.engine.boxes["b1"].healthy = False
        await w.reconciler.tick()
        same_routes(w)  # down
        w.engine.boxes["b1"].healthy = True
        w.engine.restart("b2")
        await w.reconciler.tick()
        same_routes(w)  # b1 back, b2 in a new epoch with an empty cache
        w.reconciler.drain_boxes(["b3"], "rollout")
        same_routes(w)  # drained between passes
        await settle(w.reconciler)
        same_routes(w)
        w.clock.t += 60.0
        same_routes(w)  # past the ramp
        await w.reconciler.wait_idle()
        await w.store.close()

    asyncio.run(scenario())
