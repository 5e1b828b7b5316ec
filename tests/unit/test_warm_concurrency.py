"""Per-box warm concurrency has one bound: the box's warm budget (`PlannerConfig.budget_for`), which the
planner plans within and the reconciler's per-box slots enforce for every warm, probe and pre-call warm.
The engine dispatcher between them adds no bound of its own, so a box's budget is what it gets."""

from __future__ import annotations

import asyncio
from collections import Counter

from tests.unit.reconciler_fakes import PROFILE, FakeClock, FakeEngine, FakePrefixSource, agent
from warmer.adapters.engines.dispatch import EngineDispatcher
from warmer.adapters.store import SqlStore
from warmer.core.model import BoxSpec, CompletionReport, EngineKind, Prefix
from warmer.core.placement import PlacementConfig
from warmer.core.planner import PlannerConfig
from warmer.core.warm_budget import WarmBudget
from warmer.service.reconciler import Reconciler, ReconcilerConfig


class CountingEngine(FakeEngine):
    """Counts the warm/probe requests in flight per box; the gate holds them so they pile up."""

    def __init__(self, box_ids: list[str]) -> None:
        super().__init__(box_ids)
        self.in_flight: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()

    async def complete_prefix(
        self, box: BoxSpec, prefix: Prefix, *, suffix: str = "", max_tokens: int = 1, slot: int | None = None
    ) -> CompletionReport:
        self.in_flight[box.id] += 1
        self.peak[box.id] = max(self.peak[box.id], self.in_flight[box.id])
        try:
            return await super().complete_prefix(box, prefix, suffix=suffix, max_tokens=max_tokens, slot=slot)
        finally:
            self.in_flight[box.id] -= 1


def test_a_boxs_warm_budget_is_the_only_bound_on_its_warms_in_flight(store_url: str) -> None:
    agents = [f"agent-{n}" for n in range(6)]
    fleet = [
        BoxSpec(id=b, base_url=f"http://{b}:8080", engine=EngineKind.LLAMACPP, model="m", slots=8)
        for b in ("b1", "b2")
    ]
    fake = CountingEngine(["b1", "b2"])
    fake.clock = clock = FakeClock()
    dispatcher = EngineDispatcher({EngineKind.LLAMACPP: fake}, boxes=fleet)  # type: ignore[dict-item]
    planner = PlannerConfig(
        budget=WarmBudget(max_concurrent=1, tokens_per_second=1e9, burst_tokens=1e9),
        budget_overrides={"b1": WarmBudget(max_concurrent=3, tokens_per_second=1e9, burst_tokens=1e9)},
        retire_idle_after_seconds=None,
    )

    async def scenario() -> None:
        store = SqlStore.from_url(store_url)
        reconciler = Reconciler(
            engine=dispatcher,
            store=store,
            clock=clock,
            boxes=fleet,
            profiles={"m": PROFILE},
            agents={a: agent(a) for a in agents},
            prefix_source=FakePrefixSource(),
            config=ReconcilerConfig(planner=planner, placement=PlacementConfig(min_group_size=2)),
        )
        fake.gate = asyncio.Event()
        # Restart warm-ups finish, then the warms pile up behind the gate (store writes run in worker
        # threads, so this polls; bounded, and the peak below is checked either way).
        for _ in range(2000):
            await reconciler.tick()
            await asyncio.sleep(0.005)
            if (fake.in_flight["b1"], fake.in_flight["b2"]) == (3, 1):
                break
        assert (fake.in_flight["b1"], fake.in_flight["b2"]) == (3, 1)
        fake.gate.set()
        await reconciler.wait_idle()
        await store.close()

    asyncio.run(scenario())
    assert (fake.peak["b1"], fake.peak["b2"]) == (3, 1)
