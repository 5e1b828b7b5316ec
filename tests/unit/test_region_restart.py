"""A region restart through the real Reconciler: 24 boxes restart at once, and the fleet pacer admits
their restart warm-ups and prefix warms within the budget, the most valuable boxes first, every box in the
end, none called ready before the engine itself holds its warm-up and its prefixes.

"When" below is work: the uncached prompt tokens the engines had computed by then (under a token budget,
time is that over the rate). What ran at once is counted at the engine, not from the pacer's own word.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from tests.unit.reconciler_fakes import FakeEngine, World, world
from warmer.core.fleet_pacing import FleetBudget
from warmer.core.model import BoxSpec, CompletionReport, Prefix
from warmer.core.placement import PlacementConfig
from warmer.service.reconciler import ComputedPrefix, NullObserver, Reconciler

BOXES = tuple(f"b{index:03d}" for index in range(24))
AGENTS = tuple(f"agent{index:03d}" for index in range(24))
VOLUME = {agent: 1.0 + index * 0.5 for index, agent in enumerate(AGENTS)}  # calls/minute, all distinct
IN_FLIGHT = 4
LONG_PROMPT_CHARS = 100  # the restart warm-up's long prefill is the only prompt longer than this


class CountingEngine(FakeEngine):
    """The fake engine, also counting the engine work running at once (a box counts from its restart
    warm-up's first prompt until its long prefill answered, and every prefix request while it runs) and
    the uncached prompt tokens computed so far."""

    def __init__(self, box_ids: tuple[str, ...]) -> None:
        super().__init__(box_ids)
        self.warming_up: set[str] = set()
        self.prefix_requests = 0
        self.peak = 0
        self.sent = 0  # uncached prompt tokens computed so far
        self.warmed_up: dict[str, int] = {}  # box -> generation its long prefill answered in

    def _note_peak(self) -> None:
        self.peak = max(self.peak, len(self.warming_up) + self.prefix_requests)

    async def complete_prompt(
        self,
        box: BoxSpec,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        json_schema: dict[str, object] | None = None,
    ) -> CompletionReport:
        self.warming_up.add(box.id)
        self._note_peak()
        report = await super().complete_prompt(
            box, prompt, max_tokens=max_tokens, temperature=temperature, json_schema=json_schema
        )
        await asyncio.sleep(0)
        self.sent += report.prompt_tokens - (report.cached_tokens or 0)
        if len(prompt) > LONG_PROMPT_CHARS:
            self.warming_up.discard(box.id)
            self.warmed_up[box.id] = self.boxes[box.id].generation
        return report

    async def complete_prefix(
        self, box: BoxSpec, prefix: Prefix, *, suffix: str = "", max_tokens: int = 1, slot: int | None = None
    ) -> CompletionReport:
        self.prefix_requests += 1
        self._note_peak()
        try:
            await asyncio.sleep(0)
            report = await super().complete_prefix(
                box, prefix, suffix=suffix, max_tokens=max_tokens, slot=slot
            )
            await asyncio.sleep(0)
        finally:
            self.prefix_requests -= 1
        self.sent += report.prompt_tokens - (report.cached_tokens or 0)
        return report


class ReadyWatch(NullObserver):
    """At every pass (in uncached tokens computed so far): when each box was first called ready and each
    agent first routed, and that every box called ready or routed to holds, at the engine, its restart
    warm-up and the prefixes placed or routed there."""

    def __init__(self, engine: CountingEngine) -> None:
        self.engine = engine
        self.reconciler: Reconciler | None = None
        self.ready_at: dict[str, int] = {}  # box -> uncached tokens computed when first called ready
        self.routed_after: dict[str, int] = {}  # agent -> the same, when first routed
        self.lies: list[str] = []

    def reset(self) -> None:
        self.ready_at, self.routed_after = {}, {}

    def box_states(self, ready: Mapping[str, bool], agent_warm: Mapping[tuple[str, str], bool]) -> None:
        assert self.reconciler is not None
        now = self.engine.sent
        snapshot = self.reconciler.snapshot()
        assignment = snapshot.desired.assignment if snapshot.desired is not None else {}
        held_by: dict[str, list[str]] = {}
        for agent, group in assignment.items():
            for box_id in group:
                held_by.setdefault(box_id, []).append(agent)
        for box_id, is_ready in ready.items():
            if is_ready:
                self._check(box_id, held_by.get(box_id, []), snapshot.prefixes, "ready")
                self.ready_at.setdefault(box_id, now)
        for agent, routes in snapshot.routes().items():
            for route in routes:
                self._check(route.box_id, [agent], snapshot.prefixes, f"routed for {agent}")
            if routes:
                self.routed_after.setdefault(agent, now)

    def _check(
        self, box_id: str, agents: list[str], prefixes: Mapping[str, ComputedPrefix], what: str
    ) -> None:
        fake = self.engine.boxes[box_id]
        if self.engine.warmed_up.get(box_id) != fake.generation:
            self.lies.append(f"{box_id} {what} before its restart warm-up ran in this process")
        for agent in agents:
            if prefixes[agent].prefix.token_ids not in fake.cache:
                self.lies.append(f"{box_id} {what} while {agent}'s prefix is not in its cache")


async def until_all_ready(w: World, watch: ReadyWatch) -> None:
    """Run the loop until every box was seen ready (a guard of real seconds: a stuck fleet fails, it does
    not hang the suite; no assertion reads real time)."""
    stopping = asyncio.Event()
    task = asyncio.ensure_future(w.reconciler.run(stopping))
    try:
        for _ in range(12_000):
            if len(watch.ready_at) == len(BOXES) and len(watch.routed_after) == len(AGENTS):
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"only {len(watch.ready_at)} of {len(BOXES)} boxes became ready")
    finally:
        stopping.set()
        await task


def test_a_region_restart_is_paced_most_valuable_first_and_never_ready_early(store_url: str) -> None:
    async def scenario() -> None:
        engine = CountingEngine(BOXES)
        watch = ReadyWatch(engine)
        w = world(
            store_url,
            box_ids=BOXES,
            agents=AGENTS,
            engine=engine,
            placement=PlacementConfig(min_group_size=1),
            demand=lambda: VOLUME,
            observer=watch,
            fleet_budget=FleetBudget(max_in_flight=IN_FLIGHT),  # the tokens are ample: the cap binds
        )
        watch.reconciler = w.reconciler
        await until_all_ready(w, watch)  # the fleet's first start, paced the same way

        for box_id in BOXES:  # the region restarts at once
            engine.restart(box_id)
        engine.peak, engine.sent = 0, 0
        watch.reset()
        await until_all_ready(w, watch)

        assert watch.lies == []  # never ready nor routed before the engine holds warm-up and prefixes
        assert engine.peak <= IN_FLIGHT  # counted at the engine: warm-ups and prefix requests at once
        # Most valuable first: the busiest agents' routes come back before the quietest ones', measured in
        # the uncached tokens the engines had computed when each was first routed again (the loop sees
        # progress pass by pass, so this is coarse; `test_fleet_pacer` shows the order exactly).
        ranked = sorted(AGENTS, key=lambda a: -VOLUME[a])
        busiest, quietest = ranked[:6], ranked[-6:]
        mean = lambda agents: sum(watch.routed_after[a] for a in agents) / len(agents)  # noqa: E731
        assert mean(busiest) < mean(quietest)
        await w.store.close()

    asyncio.run(scenario())
