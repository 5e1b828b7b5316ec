"""A box's prefix budget follows its load through the real Reconciler: capacity is read again on a period
for healthy boxes, the budget in force moves only past its band, a failed reading keeps it, and placement
never gives the box more prefix tokens than the budget in force."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import structlog

from tests.unit.reconciler_fakes import PREFIX_TOKENS, FakeEngine, World, route_boxes, settle, world
from warmer.core.errors import EngineUnavailable
from warmer.core.model import BoxCapacity, BoxSpec, EngineKind

POOL = 2000  # tokens: four of the 500-token prefixes, before live calls take their share
AGENTS = ("a0", "a1", "a2")
POLL = 15.0  # ReconcilerConfig.capacity_poll_seconds, the `capacity.prefix_poll_seconds` default


class PoolEngine(FakeEngine):
    """A FakeEngine whose boxes report a shared token pool (vLLM blocks, SGLang's pool) and the share live
    calls hold, the way the vLLM and SGLang adapters report them; `failing` boxes cannot be read."""

    def __init__(self, box_ids: tuple[str, ...]) -> None:
        super().__init__(box_ids)
        self.used = dict.fromkeys(box_ids, 0.0)
        self.failing: set[str] = set()
        self.reads = 0

    async def capacity(self, box: BoxSpec) -> BoxCapacity:
        self.reads += 1
        if box.id in self.failing:
            raise EngineUnavailable(box.id, "metrics read timed out")
        return BoxCapacity(pool_tokens=POOL, used_share=self.used[box.id], source="fake pool")


def placed(w: World) -> list[str]:
    return [agent for agent in AGENTS if route_boxes(w.reconciler, agent)]


def budget(w: World) -> int | None:
    return w.reconciler._health.capacity["b1"].tokens


async def later(w: World, seconds: float = POLL) -> None:
    w.clock.t += seconds
    await settle(w.reconciler)


def test_the_budget_follows_load_and_placement_follows_the_budget(store_url: str) -> None:
    """Idle: 2000 x (1 - 0.05) = 1900 tokens hold all three prefixes. Live calls at half the pool leave
    2000 x (1 - 0.5 x 1.25 - 0.05) = 650: one prefix. When they end, the room comes back."""

    async def scenario() -> None:
        engine = PoolEngine(("b1",))
        w = world(store_url, ("b1",), AGENTS, engine=engine, min_group=1)
        await settle(w.reconciler)
        assert (budget(w), placed(w)) == (1900, list(AGENTS))

        engine.used["b1"] = 0.5
        with structlog.testing.capture_logs() as logs:
            await later(w)
            await later(w)  # a second reading of the same load: no second log line
        assert budget(w) == 650
        assert len(placed(w)) == 1
        [line] = [log for log in logs if log["event"] == "box prefix budget"]
        assert (line["old"], line["new"], line["pool"], line["used"]) == (1900, 650, POOL, 0.5)

        engine.used["b1"] = 0.0
        await later(w)
        assert (budget(w), placed(w)) == (1900, list(AGENTS))

    asyncio.run(scenario())


def test_within_the_band_the_budget_in_force_holds_and_placement_is_not_rerun(store_url: str) -> None:
    """At 20% load the budget is 1400 (two prefixes). 24% reads 1300, within 10% of it: nothing moves, so
    placement is not re-run as load wobbles. 30% reads 1150, past the band: it applies."""

    async def scenario() -> None:
        engine = PoolEngine(("b1",))
        engine.used["b1"] = 0.2
        w = world(store_url, ("b1",), AGENTS, engine=engine, min_group=1)
        await settle(w.reconciler)
        assert (budget(w), len(placed(w))) == (1400, 2)
        before = placed(w)

        engine.used["b1"] = 0.24
        with structlog.testing.capture_logs() as logs:
            await later(w)
        assert (budget(w), placed(w)) == (1400, before)
        assert w.reconciler._health.capacity["b1"].used_share == 0.24  # the reading is kept, not its budget
        assert not [log for log in logs if log["event"] == "box prefix budget"]

        engine.used["b1"] = 0.3
        await later(w)
        assert budget(w) == 1150
        assert placed(w) == before  # 1150 still holds the same two 500-token prefixes

    asyncio.run(scenario())


def test_a_failed_reading_keeps_the_figures_in_force_and_readings_wait_for_their_period(
    store_url: str,
) -> None:
    async def scenario() -> None:
        engine = PoolEngine(("b1",))
        w = world(store_url, ("b1",), AGENTS, engine=engine, min_group=1)
        await settle(w.reconciler)
        reads = engine.reads
        await settle(w.reconciler)  # no time passed: no new reading
        assert engine.reads == reads

        engine.failing.add("b1")
        engine.used["b1"] = 0.9
        await later(w)
        assert engine.reads > reads
        assert (budget(w), placed(w)) == (1900, list(AGENTS))

    asyncio.run(scenario())


def test_a_configured_cache_size_still_wins_over_the_engine_figures(store_url: str) -> None:
    """`cache_capacity_tokens` on the box is the operator's word: a load reading does not move it."""

    async def scenario() -> None:
        engine = PoolEngine(("b1",))
        engine.used["b1"] = 0.6
        w = world(store_url, ("b1",), AGENTS, engine=engine, min_group=1)
        await settle(w.reconciler)
        in_force = w.reconciler._health.capacity["b1"]
        assert in_force.tokens == 400
        configured = BoxSpec(
            id="b1",
            base_url="http://b1:8080",
            engine=EngineKind.VLLM,
            model="m",
            cache_capacity_tokens=3 * PREFIX_TOKENS,
        )
        assert in_force.applied_to(configured).cache_capacity_tokens == 3 * PREFIX_TOKENS
        assert (
            in_force.applied_to(replace(configured, cache_capacity_tokens=None)).cache_capacity_tokens == 400
        )

    asyncio.run(scenario())
