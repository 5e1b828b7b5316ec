"""Asks waiting for a cold agent are answered when its warm is verified, not at the end of a later reconcile
pass: no pass runs here after the asks are in (the loop is stepped by hand and never stepped again), and
the asks must still come back ready — on the box whose warm they joined, or on another box of the agent's
group whose warm was verified first. The reconciler, its store and the pre-call service are real; the
engine is the fake at our EnginePort seam, with a gate per box."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

from tests.unit.reconciler_fakes import FakeEngine, World, routed_boxes, settle, world
from warmer.core.model import BoxSpec, CompletionReport, Prefix
from warmer.core.planner import PlannerConfig, WarmBudget
from warmer.service.dialer.prewarm import PrewarmAnswer, PrewarmAsk, PrewarmService, ReconcilerBackend

BOUND_SECONDS = 30.0  # a bound on the test, never the behaviour under test


class GatedEngine(FakeEngine):
    """The fake engine, holding each box's prefix requests until that box's gate opens."""

    def __init__(self, box_ids: Sequence[str]) -> None:
        super().__init__(box_ids)
        self.gates: dict[str, asyncio.Event] = {}
        self.held: Counter[str] = Counter()  # requests that reached a closed gate, per box
        self.arrived = asyncio.Event()  # set when the first one does

    async def complete_prefix(
        self, box: BoxSpec, prefix: Prefix, *, suffix: str = "", max_tokens: int = 1, slot: int | None = None
    ) -> CompletionReport:
        gate = self.gates.get(box.id)
        if gate is not None and not gate.is_set():
            self.held[box.id] += 1
            self.arrived.set()
            await gate.wait()
        return await super().complete_prefix(box, prefix, suffix=suffix, max_tokens=max_tokens, slot=slot)


async def cold_agent(store_url: str) -> tuple[World, GatedEngine, tuple[str, ...]]:
    """Warm once, idle until released, every box restarted: the agent has no route and no routing."""
    engine = GatedEngine(("b1", "b2", "b3"))
    planner = PlannerConfig(
        budget=WarmBudget(max_concurrent=2, tokens_per_second=1e6), retire_idle_after_seconds=60.0
    )
    w = world(store_url, box_ids=("b1", "b2", "b3"), planner=planner, engine=engine)
    await settle(w.reconciler)
    w.clock.t += 120.0
    await settle(w.reconciler)
    for box_id in ("b1", "b2", "b3"):
        engine.restart(box_id)
    await settle(w.reconciler)
    assert routed_boxes(w.reconciler, "sales") == []
    desired = w.reconciler.snapshot().desired
    assert desired is not None
    return w, engine, desired.assignment["sales"]


def asks(service: PrewarmService, n: int) -> list[asyncio.Task[PrewarmAnswer]]:
    return [
        asyncio.create_task(service.prewarm(PrewarmAsk("sales", call_id=f"c{i}", wait_seconds=60.0)))
        for i in range(n)
    ]


async def let_them_in() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


async def first_warms_held(store_url: str) -> tuple[World, GatedEngine, tuple[str, ...]]:
    """A fresh daemon: the boxes are warmed up and the agent's first warms are held at the engine, so the
    agent has no routing yet (a box joins it once the agent is verified warm there)."""
    engine = GatedEngine(("b1", "b2", "b3"))
    w = world(store_url, box_ids=("b1", "b2", "b3"), engine=engine)
    await w.reconciler.tick()  # the restart warm-ups (no box is warmed up yet, so no prefix warm)
    await w.reconciler.wait_idle()
    engine.gates = {box_id: asyncio.Event() for box_id in ("b1", "b2", "b3")}
    await w.reconciler.tick()  # the agent's first warms start, and are held
    await asyncio.wait_for(engine.arrived.wait(), BOUND_SECONDS)
    desired = w.reconciler.snapshot().desired
    assert desired is not None
    assert desired.routing is not None
    assert desired.routing.get("sales", ()) == ()
    return w, engine, desired.assignment["sales"]


def test_waiting_asks_are_answered_ready_when_the_warm_they_joined_is_verified(store_url: str) -> None:
    """...without waiting for the pass that joins the box to the agent's routing."""

    async def scenario() -> None:
        w, engine, group = await first_warms_held(store_url)
        service = PrewarmService(ReconcilerBackend(w.reconciler), w.clock, max_wait_seconds=60.0)
        waiting = asks(service, 50)
        await let_them_in()
        assert not any(task.done() for task in waiting)
        first = group[0]
        engine.gates[first].set()  # the warm the asks joined (the first box of the group) goes through
        done, pending = await asyncio.wait(waiting, timeout=BOUND_SECONDS)
        assert not pending, "the asks were still waiting for a pass after their warm was verified"
        answers = [task.result() for task in done]
        assert {(a.ready, a.state.value, a.box_id) for a in answers} == {(True, "warm", first)}
        for gate in engine.gates.values():
            gate.set()
        await w.reconciler.wait_idle()
        await w.reconciler.tick()
        assert first in routed_boxes(w.reconciler, "sales")  # the pass's routing agrees with the answers
        await w.store.close()

    asyncio.run(scenario())


def test_a_warm_verified_first_on_another_box_of_the_group_answers_the_waiting_asks(store_url: str) -> None:
    async def scenario() -> None:
        w, engine, group = await cold_agent(store_url)
        assert len(group) >= 2
        for box_id in group:
            engine.gates[box_id] = asyncio.Event()
        service = PrewarmService(ReconcilerBackend(w.reconciler), w.clock, max_wait_seconds=60.0)
        waiting = asks(service, 50)
        await let_them_in()
        await (
            w.reconciler.tick()
        )  # the held pre-call demand: the pass starts the warm on the rest of the group
        await let_them_in()
        other = group[1]
        held_before = Counter(engine.warm_requests)
        engine.gates[other].set()  # the first box's warm (the one the asks joined) stays held
        done, pending = await asyncio.wait(waiting, timeout=BOUND_SECONDS)
        assert not pending, "the asks waited for the warm they joined, not the first one verified"
        assert {(task.result().ready, task.result().box_id) for task in done} == {(True, other)}
        assert engine.warm_requests[group[0]] == held_before[group[0]]  # still held: not the answers' box
        for gate in engine.gates.values():
            gate.set()
        await w.reconciler.wait_idle()
        await w.store.close()

    asyncio.run(scenario())
