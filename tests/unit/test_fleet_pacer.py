"""The fleet pacer (`warmer.service.engine_work.fleet_pacer`) over a fake clock: 200 boxes restart at once,
each with a restart warm-up and then its prefix warms; with a budget for 8 in flight and a token rate, never
more runs, the budget's tokens are never overspent, the most valuable boxes are done first, and all are."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.unit.reconciler_fakes import FakeClock
from warmer.core.fleet_pacing import FleetBudget, WorkKind
from warmer.service.engine_work.fleet_pacer import FleetPacer
from warmer.service.reconciler.work_values import WorkValues

BOXES = 200
IN_FLIGHT = 8
RATE = 10_000.0  # uncached tokens per second
WARMUP_TOKENS, PREFIX_TOKENS, PREFIXES = 2_000.0, 500.0, 3


class Fleet:
    """Fake engine work: counts what runs at once and what it spends, at the fake clock's time."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.running = 0
        self.peak = 0
        self.spent: list[tuple[float, float]] = []  # (clock time, tokens) at each start
        self.done_at: dict[int, float] = {}

    async def work(self, pacer: FleetPacer, kind: WorkKind, box: int, value: float, tokens: float) -> None:
        async with pacer.admitted(kind, f"b{box}", value=value, cost_tokens=tokens):
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.spent.append((self.clock.now(), tokens))
            for _ in range(3):
                await asyncio.sleep(0)  # the engine computes; others may start meanwhile
            self.running -= 1

    async def box(self, pacer: FleetPacer, box: int, value: float) -> None:
        """A restart warm-up worth the box's agents, then its prefixes, each worth a third of it."""
        await self.work(pacer, WorkKind.RESTART_WARMUP, box, value, WARMUP_TOKENS)
        prefixes = (
            self.work(pacer, WorkKind.WARM, box, value / PREFIXES, PREFIX_TOKENS) for _ in range(PREFIXES)
        )
        await asyncio.gather(*prefixes)
        self.done_at[box] = self.clock.now()


def value_of(box: int) -> float:
    """Values in a scrambled order of box numbers, all distinct."""
    return float((box * 7919) % BOXES + 1)


def test_two_hundred_boxes_restarted_at_once_are_paced_most_valuable_first() -> None:
    async def scenario() -> tuple[Fleet, FleetPacer, float]:
        clock = FakeClock()
        fleet = Fleet(clock)
        pacer = FleetPacer(
            clock=clock,
            budget=FleetBudget(tokens_per_second=RATE, max_in_flight=IN_FLIGHT),
            box_limit=lambda _box: 2,
            per_box_fallback=RATE,
            declared=list,
        )
        started = clock.now()
        await asyncio.gather(*(fleet.box(pacer, box, value_of(box)) for box in range(BOXES)))
        await pacer.close()
        return fleet, pacer, started

    fleet, pacer, started = asyncio.run(scenario())
    assert sorted(fleet.done_at) == list(range(BOXES))  # every box warmed: nothing dropped
    assert fleet.peak <= IN_FLIGHT
    assert pacer.queued() == {kind.value: 0 for kind in WorkKind}
    assert pacer.admission.running == {}
    spent = 0.0
    for at, tokens in sorted(fleet.spent):  # a full bucket (one second) and the rate since, never more
        spent += tokens
        assert spent <= RATE * (1.0 + at - started) + 1e-6
    total = BOXES * (WARMUP_TOKENS + PREFIXES * PREFIX_TOKENS)
    last = max(fleet.done_at.values()) - started
    assert last == pytest.approx((total - RATE) / RATE, rel=0.01)  # and it keeps the budget busy
    by_value = sorted(range(BOXES), key=lambda box: -value_of(box))
    ready = [fleet.done_at[box] for box in by_value]
    # The top tenth by value is done before any box of the bottom half, and done times follow value.
    assert max(ready[:20]) < min(ready[100:])
    inversions = sum(1 for a, b in itertools.pairwise(ready) if a > b)
    assert inversions < BOXES // 10


def test_a_restarted_box_keeps_the_value_it_held_while_placement_gives_its_agents_elsewhere() -> None:
    values = WorkValues()
    tokens = {"busy": 1_000, "quiet": 1_000}
    values.note({"busy": ("b1",), "quiet": ("b2",)}, {"busy": 30.0, "quiet": 1.0}, tokens)
    assert (values.box("b1"), values.box("b2")) == (30_000.0, 1_000.0)
    values.note({"busy": ("b2",), "quiet": ("b2",)}, {"busy": 30.0, "quiet": 1.0}, tokens)  # b1 restarted
    assert (values.box("b1"), values.box("b2")) == (30_000.0, 31_000.0)
    values.note({"busy": ("b2",), "quiet": ("b2",)}, {"busy": 60.0, "quiet": 1.0}, tokens)  # volume moved
    assert values.box("b2") == 61_000.0
    ticket = values.ticket(["busy", "quiet"], 1_000, 2, probe=False, urgent=False)
    assert (ticket.kind, ticket.value, ticket.cost) == (WorkKind.WARM, 61_000.0, 2_000.0)
    probe = values.ticket(["busy"], 1_000, 2, probe=True, urgent=True)
    assert (probe.kind, probe.cost, probe.urgent) == (WorkKind.PROBE, 1_000.0, True)


def test_a_cancelled_wait_leaves_the_queue_and_urgent_work_passes_a_full_fleet() -> None:
    async def scenario() -> None:
        pacer = FleetPacer(
            clock=FakeClock(),
            budget=FleetBudget(tokens_per_second=RATE, max_in_flight=1),
            box_limit=lambda _box: 2,
            per_box_fallback=RATE,
            declared=list,
        )
        release = asyncio.Event()
        order: list[str] = []

        async def piece(name: str, *, urgent: bool = False) -> None:
            async with pacer.admitted(WorkKind.WARM, name, value=1.0, cost_tokens=10.0, urgent=urgent):
                order.append(name)
                await release.wait()

        holder = asyncio.ensure_future(piece("holder"))
        await asyncio.sleep(0)
        waiting = asyncio.ensure_future(piece("waiting"))
        await asyncio.sleep(0)
        assert pacer.queued()["warm"] == 1
        waiting.cancel()  # its box left the fleet: it leaves the queue
        await asyncio.gather(waiting, return_exceptions=True)
        assert pacer.queued()["warm"] == 0
        precall = asyncio.ensure_future(piece("precall", urgent=True))
        await asyncio.sleep(0)
        assert order == ["holder", "precall"]  # past the full fleet at once
        release.set()
        await asyncio.gather(holder, precall)
        assert pacer.admission.running == {}
        await pacer.close()

    asyncio.run(scenario())
