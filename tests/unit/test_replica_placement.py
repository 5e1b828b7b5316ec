"""Replicas agree on placement whatever order they saw the boxes become eligible in.

Placement is sticky: an agent stays on the boxes it holds. When each replica took "the boxes it holds" from
its own routing history, two replicas that saw the fleet come up in different orders kept different groups
for good: one waited forever for a prefix on a box whose lease holder had placed that agent elsewhere (the
box never ready there, the agent's routes short), as `bench.fleet_scale` showed at 500 boxes. Here two real
Reconcilers share one database over one FakeEngine: replica "one" starts while only b1 and b2 are up, so it
places both agents there; then b3 and b4 come up and replica "two" starts, seeing all four at once. And with
health polled by lease holders only (as in production), a holder late to report its boxes (stale) makes the
other replica move no agent.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.unit.reconciler_fakes import FakeClock, FakeEngine
from tests.unit.test_replica_reconcilers import BOX_IDS, Replica, replica, settle
from warmer.adapters.store import upgrade_database
from warmer.core.model import WarmRecord, WarmState
from warmer.core.observations import DEFAULT_STALE_AFTER_SECONDS
from warmer.core.placement.ranking import rendezvous_order
from warmer.core.planner import PrefixRef
from warmer.service.reconciler.incumbents import SharedIncumbents


@pytest.fixture
def url(tmp_path: Path) -> str:
    database = f"sqlite:///{tmp_path / 'warmer.db'}"
    upgrade_database(database)
    return database


def assignment(each: Replica) -> dict[str, set[str]]:
    desired = each.reconciler.snapshot().desired
    assert desired is not None
    return {agent: set(group) for agent, group in desired.assignment.items()}


def routed(each: Replica) -> dict[str, set[str]]:
    return {a: {r.box_id for r in rs} for a, rs in each.reconciler.snapshot().routes().items()}


def test_replicas_that_saw_the_boxes_come_up_in_different_orders_converge(url: str) -> None:
    engine, clock = FakeEngine(BOX_IDS), FakeClock()
    engine.boxes["b3"].healthy = engine.boxes["b4"].healthy = False
    one = replica(url, "one", engine, clock)
    two = replica(url, "two", engine, clock)

    async def scenario() -> dict[str, set[str]]:
        for _ in range(2):
            await one.beat()
        await settle(one)  # "one" alone: both agents placed on b1 and b2, warmed there
        early = assignment(one)
        engine.boxes["b3"].healthy = engine.boxes["b4"].healthy = True
        await settle(one)
        for _ in range(2):  # "two" joins: the leases split two and two
            await one.beat()
            await two.beat()
        await settle(one, two)
        settled = (assignment(one), len(engine.warms()))
        await settle(one, two)  # and it stays so: nothing moves or is warmed again
        assert (assignment(one), len(engine.warms())) == settled
        return early

    early = asyncio.run(scenario())
    assert early == {"sales": {"b1", "b2"}, "support": {"b1", "b2"}}
    assert one.ownership.owned()  # each holds some boxes: each warms only what its placement names
    assert two.ownership.owned()
    assert assignment(one) == assignment(two)
    assert one.reconciler.ready_box_ids() == two.reconciler.ready_box_ids() == set(BOX_IDS)
    assert routed(one) == routed(two)
    assert all(len(boxes) == 2 for boxes in routed(two).values())
    assert len(engine.warms()) == 4  # each agent on its two boxes, warmed once: no warm for a placement
    # that only one replica held


def test_incumbents_are_the_boxes_holding_the_current_prefix_now_in_rendezvous_order() -> None:
    def row(
        box_id: str, epoch: str, prefix: str, state: WarmState
    ) -> tuple[tuple[str, str, str], WarmRecord]:
        return (box_id, epoch, prefix), WarmRecord(box_id, epoch, prefix, state, 100)

    records = dict(
        [
            row("b1", "e1", "p-a", WarmState.WARM),
            row("b2", "e1", "p-a", WarmState.STALE),
            row("b3", "e1", "p-a", WarmState.WARMING),  # the holder is putting it there now
            row("b4", "e1", "p-a", WarmState.EVICTED),  # gone from the engine
            row("b5", "e1", "p-a", WarmState.FAILED),
            row("b6", "e1", "p-a", WarmState.COLD),  # released: the holder keeps it no more
            row("b7", "e0", "p-a", WarmState.WARM),  # an earlier process of b7
            row("b1", "e1", "p-old", WarmState.WARM),  # the agent's earlier prompt
        ]
    )
    epochs = {f"b{i}": "e1" for i in range(1, 8)}
    refs = {"a": PrefixRef("p-a", 100), "b": PrefixRef("p-b", 100)}
    found = SharedIncumbents(8).of(refs, records, epochs)
    assert found == {"a": tuple(rendezvous_order("a", ["b1", "b2", "b3"], 8))}


def sharing_replica(url: str, name: str, engine: FakeEngine, clock: FakeClock) -> Replica:
    """`replica`, with health polled by each box's lease holder only and read from the store elsewhere."""
    return replica(url, name, engine, clock, sharing=True)


def test_a_holder_late_to_report_its_boxes_moves_no_agent_on_the_other_replica(url: str) -> None:
    """Before: the reader took the late boxes out of placement, moved their agents onto boxes it held and
    warmed them there (3 warms a spell), then kept that placement for good (its own routing)."""
    engine, clock = FakeEngine(BOX_IDS), FakeClock()
    one, two = sharing_replica(url, "one", engine, clock), sharing_replica(url, "two", engine, clock)

    async def scenario() -> None:
        for _ in range(2):
            await one.beat()
            await two.beat()
        await settle(one, two)
        before, warms = assignment(one), len(engine.warms())
        assert assignment(two) == before
        late = one.ownership.owned()
        for _ in range(3):  # "one" renews its leases but reports nothing for longer than the bound
            for _ in range(2):
                clock.t += DEFAULT_STALE_AFTER_SECONDS / 2 + 0.5
                await one.beat()
                await two.beat()
            await settle(two, rounds=2)
            assert not late & (two.reconciler.ready_box_ids() or set())  # not ready on a late report
            assert assignment(two) == before
            assert all(not late & boxes for boxes in routed(two).values())
            await settle(one, two)
            assert routed(one) == routed(two)
        assert len(engine.warms()) == warms

    asyncio.run(scenario())
