"""Health polled by lease holders only, on the real databases (issue 22).

1. `SqlHealthExchange` on SQLite and PostgreSQL: a replica writes observations only of boxes whose lease
   it holds, a reader ages them by the database's clock from the observer's stamp, and an observation
   whose observer holds the box no more is marked so.
2. Three in-process replicas (real `BoxOwnership` heartbeats, real `SqlCoordination` and
   `SqlHealthExchange`) on one real PostgreSQL database, over one FakeEngine each replica counts its own
   requests to: per health interval every box answers one health poll in all (not one per replica); a
   restarted box leaves readiness on every replica after its holder's next poll and each one's next read;
   the boxes of a replica that stops are polled by their new holders from the pass their gain wakes.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from tests.unit.reconciler_fakes import (
    CountingEngine,
    FakeClock,
    FakeEngine,
    replica_reconciler,
)
from warmer.adapters.store import SqlStore, upgrade_database
from warmer.adapters.store.coordination import SqlCoordination
from warmer.adapters.store.observations import SqlHealthExchange
from warmer.core.leases import LeaseConfig
from warmer.core.observations import HealthObservation
from warmer.ports import HealthExchangePort
from warmer.service.reconciler import Reconciler
from warmer.service.replicas.ownership import BoxOwnership
from warmer.service.replicas.replica_gate import ReplicaGate

pytestmark = pytest.mark.integration

CONFIG = LeaseConfig(lease_seconds=15.0, renew_seconds=5.0)
# Heartbeats run between passes here, not in a task of their own: leases that a slow pass on a loaded
# machine never lets expire (a lapse would move boxes mid-count).
LONG = LeaseConfig(lease_seconds=600.0, renew_seconds=5.0)
POLL_SECONDS = 5.0
BOX_IDS = tuple(f"b{n}" for n in range(1, 7))
UP = HealthObservation(healthy=True, epoch="e1")


@pytest.fixture
def migrated_url(database_url: str) -> str:
    upgrade_database(database_url)
    return database_url


@pytest.fixture
def stores(migrated_url: str) -> Iterator[Callable[[], SqlStore]]:
    made: list[SqlStore] = []

    def make() -> SqlStore:
        made.append(SqlStore.from_url(migrated_url))
        return made[-1]

    yield make
    for store in made:
        asyncio.run(store.close())


def test_observations_are_written_by_holders_and_aged_by_the_database(
    stores: Callable[[], SqlStore],
) -> None:
    async def scenario() -> None:
        one_store, two_store = stores(), stores()
        one, two = SqlCoordination(one_store), SqlCoordination(two_store)
        exchange: HealthExchangePort = SqlHealthExchange(one_store)
        reader = SqlHealthExchange(two_store)
        await one.heartbeat("r1", ["a", "b"], at=time.time(), config=CONFIG)  # r1 holds both
        assert await exchange.publish("r1", {"a": UP}, stamp=False) == {"a"}
        assert await exchange.publish("r2", {"b": UP}, stamp=False) == frozenset()  # not r2's lease
        seen = await reader.read(["a", "b", "c"])
        assert set(seen) == {"a"}
        assert seen["a"].observation == UP
        assert seen["a"].observer == "r1"
        assert seen["a"].held_by_observer
        assert seen["a"].age_seconds is None  # no round stamped yet: not fresh
        assert not seen["a"].fresh(15.0)
        await exchange.publish("r1", {}, stamp=True)
        stamped = (await reader.read(["a"]))["a"]
        assert stamped.age_seconds is not None
        assert 0.0 <= stamped.age_seconds < 5.0
        assert stamped.fresh(15.0)
        down = HealthObservation(healthy=False, epoch="e1", failure="refused", error="GET /health: refused")
        await exchange.publish("r1", {"a": down}, stamp=True)
        assert (await reader.read(["a"]))["a"].observation == down
        await one.release("r1")
        await two.heartbeat("r2", ["a", "b"], at=time.time(), config=CONFIG)  # r2 takes both
        moved = (await reader.read(["a"]))["a"]
        assert not moved.held_by_observer  # r1's word on a box it holds no more
        assert not moved.fresh(15.0)

    asyncio.run(scenario())


@dataclass
class Replica:
    reconciler: Reconciler
    engine: CountingEngine
    ownership: BoxOwnership


def replica(url: str, name: str, engine: FakeEngine, clock: FakeClock) -> Replica:
    store = SqlStore.from_url(url, now=clock.now)
    coordination = SqlCoordination(store)
    holder: list[Reconciler] = []
    ownership = BoxOwnership(
        coordination=coordination,
        clock=clock,
        config=LONG,
        fleet=lambda: BOX_IDS,
        replica_id=name,
        on_change=lambda gained, lost: holder[0].replicas.leases_changed(gained, lost) if holder else None,
    )
    store.fence_box_writes(name)
    counting = CountingEngine(engine)
    gate = ReplicaGate(
        ownership=ownership,
        coordination=coordination,
        health=SqlHealthExchange(store),
        stale_after_seconds=3 * POLL_SECONDS,
    )
    reconciler = replica_reconciler(counting, store, clock, BOX_IDS, gate, health_poll_seconds=POLL_SECONDS)
    holder.append(reconciler)
    return Replica(reconciler, counting, ownership)


async def interval(replicas: list[Replica], clock: FakeClock) -> None:
    """One health interval (= the renew interval here): every replica's heartbeat and timer poll, then a
    pass on each (as a poke would run)."""
    clock.t += POLL_SECONDS
    for each in replicas:
        await each.ownership.beat()
    for each in replicas:
        await each.reconciler.poll_health()
    for each in replicas:
        await each.reconciler.tick()
        await each.reconciler.wait_idle()


def health_polls(replicas: list[Replica]) -> Counter[str]:
    return Counter({b: sum(r.engine.polls[(b, "health")] for r in replicas) for b in BOX_IDS})


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_three_replicas_poll_each_box_once_per_interval_and_all_see_a_restart(migrated_url: str) -> None:
    engine, clock = FakeEngine(BOX_IDS), FakeClock()
    engine.clock = clock
    replicas = [replica(migrated_url, name, engine, clock) for name in ("r1", "r2", "r3")]

    async def scenario() -> None:
        for _ in range(2):  # membership, then the fair share
            for each in replicas:
                await each.ownership.beat()
        assert [len(r.ownership.owned()) for r in replicas] == [2, 2, 2]
        for _ in range(3):
            await interval(replicas, clock)
        for each in replicas:
            assert each.reconciler.ready_box_ids() == set(BOX_IDS)

        before = health_polls(replicas)
        for _ in range(4):
            await interval(replicas, clock)
        assert health_polls(replicas) - before == dict.fromkeys(BOX_IDS, 4)  # one per box per interval
        for each in replicas:  # each polled only what it holds
            assert each.engine.polled() == each.ownership.owned()

        engine.restart("b1")
        clock.t += POLL_SECONDS
        for each in replicas:
            await each.ownership.beat()
        for each in replicas:  # each timer fires once: the holder polls, every other replica reads
            await each.reconciler.poll_health()
        for each in replicas:
            await each.reconciler.poll_health()
        for each in replicas:
            assert "b1" not in (each.reconciler.ready_box_ids() or set())
            assert each.reconciler.snapshot().live["b1"].epoch == "gen-1"

        stopping = replicas[2]
        gone = stopping.ownership.owned()
        await stopping.reconciler.close()
        await stopping.ownership._release()  # a graceful stop hands its leases back
        survivors = replicas[:2]
        before = health_polls(survivors)
        for _ in range(2):  # the second beat shows each survivor what the other took
            for each in survivors:
                await each.ownership.beat()
        for each in survivors:
            await each.reconciler.tick()  # the pass the gain woke: the new holder polls at once
            await each.reconciler.wait_idle()
        assert health_polls(survivors) - before == dict.fromkeys(gone, 1)
        for _ in range(3):
            await interval(survivors, clock)
        for each in survivors:
            assert each.reconciler.ready_box_ids() == set(BOX_IDS)

    asyncio.run(scenario())
