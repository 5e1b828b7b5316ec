"""A reconcile pass yields the event loop between its CPU-heavy steps (placement, handover, the plan,
readiness): a pre-call ask that arrives during a pass is answered between two steps, not after the whole
pass (at 1,000 agents a pass held the loop for tens of milliseconds at a time)."""

from __future__ import annotations

import asyncio

import pytest

import warmer.service.reconciler.loop as loop_module
import warmer.service.reconciler.ready_reports as ready_module
from tests.unit.reconciler_fakes import settle, world


def test_an_ask_gets_a_turn_between_placement_the_plan_and_readiness(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = []
    real_plan, real_ready = loop_module.plan, ready_module.boxes_ready

    def plan(*args: object, **kwargs: object) -> object:
        order.append("plan")
        return real_plan(*args, **kwargs)  # type: ignore[arg-type]

    def boxes_ready(*args: object, **kwargs: object) -> object:
        order.append("readiness")
        return real_ready(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loop_module, "plan", plan)
    monkeypatch.setattr(ready_module, "boxes_ready", boxes_ready)

    async def scenario() -> None:
        w = world(store_url)
        await settle(w.reconciler)  # warm and routed: the pass below is the steady state's
        desired = w.reconciler._desired
        real_build = desired.build

        async def build(*args: object, **kwargs: object) -> object:
            order.append("placement")
            built = await real_build(*args, **kwargs)  # type: ignore[arg-type]
            order.append("handover done")
            return built

        desired.build = build  # type: ignore[method-assign]
        done = False

        async def asks() -> None:  # an ask in every turn of the loop the pass leaves free
            while not done:
                order.append("ask")
                await asyncio.sleep(0)

        order.clear()
        beside = asyncio.ensure_future(asks())
        await asyncio.sleep(0)
        await w.reconciler.tick()
        done = True
        await beside

    asyncio.run(scenario())
    steps = [entry for entry in order if entry != "ask"]
    assert steps == ["placement", "handover done", "plan", "readiness"]
    at = {step: order.index(step) for step in steps}
    # placement, a turn, handover, a turn, capacity fit: two asks inside the build
    assert order[at["placement"] : at["handover done"]].count("ask") >= 2
    assert "ask" in order[at["handover done"] : at["plan"]]  # then a turn before the plan
    assert "ask" in order[at["plan"] : at["readiness"]]
    assert "ask" in order[at["readiness"] :]


def test_a_pre_call_warm_charged_during_the_turn_after_the_plan_keeps_its_charge(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan hands the per-box token buckets over before the pass yields: a pre-call warm started in
    that turn pays into them, and the pass does not overwrite its charge with the plan's buckets."""
    real_plan = loop_module.plan

    async def scenario() -> None:
        w = world(store_url)
        await settle(w.reconciler)
        runner = w.reconciler._runner
        charged: list[float] = []

        def plan(*args: object, **kwargs: object) -> object:
            result = real_plan(*args, **kwargs)  # type: ignore[arg-type]

            def ask() -> None:  # a pre-call warm in the next turn of the loop
                runner.charge("b1", 500, w.clock.now())
                charged.append(runner.buckets["b1"].tokens)

            asyncio.get_running_loop().call_soon(ask)
            return result

        monkeypatch.setattr(loop_module, "plan", plan)
        await w.reconciler.tick()
        assert len(charged) == 1
        assert runner.buckets["b1"].tokens == charged[0]  # the charge stands

    asyncio.run(scenario())
