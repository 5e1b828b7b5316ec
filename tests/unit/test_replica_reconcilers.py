"""Two real Reconcilers as two replicas on one database (a temp SQLite file, each with its own store and
lease holder) over one FakeEngine whose request log is the engine side: each box's restart warm-up and
warm come from its lease holder only, both replicas answer readiness for every box from the store, a
rollout received by one drains the box on the other, and the survivor of a replica that stopped
renewing re-probes what the dead one verified before routing to it."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.unit.reconciler_fakes import (
    PROFILE,
    FakeClock,
    FakeEngine,
    FakePrefixSource,
    agent,
    boxes,
    replica_reconciler,
)
from warmer.adapters.store import SqlStore, upgrade_database
from warmer.adapters.store.coordination import SqlCoordination
from warmer.adapters.store.observations import SqlHealthExchange
from warmer.core.leases import LeaseConfig
from warmer.core.shared_state import StateChange
from warmer.core.warmstate import RetryBackoff
from warmer.core.webhook import BoxUrlPolicy, sign_body
from warmer.service.fleet.deploy import (
    DeployOutcome,
    DeployResult,
    DeployService,
    WebhookConfig,
    rollout_drain_reason,
)
from warmer.service.reconciler import Reconciler
from warmer.service.replicas.ownership import BoxOwnership, SoleOwnership
from warmer.service.replicas.replica_gate import ReplicaGate

BOX_IDS = ("b1", "b2", "b3", "b4")
LEASES = LeaseConfig(lease_seconds=15.0, renew_seconds=5.0)
SECRET = "deploy-secret"


@dataclass
class Replica:
    name: str
    reconciler: Reconciler
    ownership: BoxOwnership
    coordination: SqlCoordination

    async def beat(self) -> None:
        await self.ownership.beat()


def replica(url: str, name: str, engine: FakeEngine, clock: FakeClock, *, sharing: bool = False) -> Replica:
    """One replica on the shared database; `sharing`: health polled by each box's lease holder only and
    read from the store elsewhere (`SqlHealthExchange`)."""
    store = SqlStore.from_url(url, now=clock.now)
    coordination = SqlCoordination(store)
    holder: list[Reconciler] = []
    ownership = BoxOwnership(
        coordination=coordination,
        clock=clock,
        config=LEASES,
        fleet=lambda: BOX_IDS,
        replica_id=name,
        on_change=lambda gained, lost: holder[0].replicas.leases_changed(gained, lost) if holder else None,
    )
    health = SqlHealthExchange(store) if sharing else None
    gate = ReplicaGate(ownership=ownership, coordination=coordination, health=health)
    reconciler = replica_reconciler(engine, store, clock, BOX_IDS, gate)
    holder.append(reconciler)
    return Replica(name, reconciler, ownership, coordination)


async def settle(*replicas: Replica, rounds: int = 8) -> None:
    for _ in range(rounds):
        for each in replicas:
            await each.reconciler.tick()
            await each.reconciler.wait_idle()


@pytest.fixture
def url(tmp_path: Path) -> str:
    database = f"sqlite:///{tmp_path / 'warmer.db'}"
    upgrade_database(database)
    return database


def restart_warmups(engine: FakeEngine) -> Counter[str]:
    return Counter(box for box, _prompt, schema, _t in engine.prompts if schema is not None)


def test_each_box_is_worked_by_its_holder_only_and_ready_on_both(url: str) -> None:
    engine, clock = FakeEngine(BOX_IDS), FakeClock()
    one, two = replica(url, "one", engine, clock), replica(url, "two", engine, clock)

    async def scenario() -> None:
        for _ in range(2):  # membership, then the fair share
            await one.beat()
            await two.beat()
        await settle(one, two)

    asyncio.run(scenario())
    assert len(one.ownership.owned()) == len(two.ownership.owned()) == 2
    assert one.ownership.owned() | two.ownership.owned() == set(BOX_IDS)
    assert restart_warmups(engine) == dict.fromkeys(BOX_IDS, 1)  # once per box, not once per replica
    warmed = Counter(box for box, kind, _ in engine.log if kind == "warm")
    assert max(warmed.values()) == 2  # two agents at most per box, each warmed once
    assert sum(warmed.values()) == sum(len(g) for g in one.reconciler.snapshot().desired.assignment.values())  # type: ignore[union-attr,misc]
    assert one.reconciler.ready_box_ids() == two.reconciler.ready_box_ids() == set(BOX_IDS)
    assert one.reconciler.snapshot().routes() == two.reconciler.snapshot().routes()


def test_a_rollout_stored_by_one_replica_drains_the_box_on_the_other(url: str) -> None:
    engine, clock = FakeEngine(BOX_IDS), FakeClock()
    one, two = replica(url, "one", engine, clock), replica(url, "two", engine, clock)

    async def scenario() -> None:
        for _ in range(2):
            await one.beat()
            await two.beat()
        await settle(one, two)
        drain = StateChange(drain={"b1": rollout_drain_reason("ev")})
        assert await one.coordination.apply_deploy("ev", "rollout.started", "sha", clock.now(), drain)
        await settle(one, two)

    asyncio.run(scenario())
    assert two.reconciler.draining() == {"b1": rollout_drain_reason("ev")}
    assert "b1" not in (two.reconciler.ready_box_ids() or set())
    assert "b1" in two.reconciler.drained_boxes()


def test_the_survivor_reprobes_a_dead_replicas_boxes_before_routing_them(url: str) -> None:
    engine, clock = FakeEngine(BOX_IDS), FakeClock()
    one, two = replica(url, "one", engine, clock), replica(url, "two", engine, clock)

    async def scenario() -> frozenset[str]:
        for _ in range(2):
            await one.beat()
            await two.beat()
        await settle(one, two)
        inherited = one.ownership.owned()
        probes_before = len(engine.probes())
        clock.t += LEASES.lease_seconds  # "one" dies: it never renews again
        await two.beat()
        assert two.ownership.owned() == set(BOX_IDS)
        engine.gate = asyncio.Event()  # the re-probes wait at the engine until the check below
        await two.reconciler.tick()  # before the re-probes finish, nothing inherited is routed
        assert not inherited & (two.reconciler.ready_box_ids() or set())
        engine.gate.set()
        await two.reconciler.wait_idle()
        await settle(two)
        assert {box for box, kind, _ in engine.log[probes_before:] if kind == "probe"} >= inherited
        return inherited

    inherited = asyncio.run(scenario())
    assert restart_warmups(engine) == dict.fromkeys(BOX_IDS, 1)  # no warm-up run again on takeover
    assert two.reconciler.ready_box_ids() == set(BOX_IDS)
    assert inherited


def test_a_box_handed_over_right_after_its_warm_up_is_not_warmed_up_again_by_its_taker(url: str) -> None:
    """The taker read the box's warm-up as "not started" while its first holder ran it; the box is handed
    over once that holder is idle. Acting on the old read ran the warm-up and its warms a second time (the
    three-replica PostgreSQL test saw it); the taker reads the warm-up back after the gain first."""
    engine, clock = FakeEngine(BOX_IDS), FakeClock()
    one, two = replica(url, "one", engine, clock), replica(url, "two", engine, clock)

    async def scenario() -> None:
        await one.beat()  # alone: it takes every box
        await two.reconciler.tick()  # sees the boxes, reads no warm-up phases yet: "not started"
        assert all(two.reconciler.replicas.acts_on(b) is False for b in BOX_IDS)
        await settle(one)  # "one" warms every box up, and warms its prefixes
        mark = len(engine.log)
        await two.beat()  # "two" joins; "one" hands back its excess (idle) and "two" takes it
        await one.beat()
        await two.beat()
        handed = two.ownership.owned()
        assert len(handed) == 2
        await settle(two, one)
        warms_after = [box for box, kind, _ in engine.log[mark:] if kind == "warm"]
        assert not handed & set(warms_after), warms_after

    asyncio.run(scenario())
    assert restart_warmups(engine) == dict.fromkeys(BOX_IDS, 1)
    assert two.reconciler.ready_box_ids() == one.reconciler.ready_box_ids() == set(BOX_IDS)


def test_a_replica_whose_lease_lapsed_mid_warm_finishes_the_box_when_it_gets_it_back(url: str) -> None:
    """A heartbeat late past the local deadline: the replica reports its leases lost and cancels its warms,
    whose rows stay `warming`; its next heartbeat renews them (nobody took them: the holding is continuous).
    No task of this replica will finish those rows, so they are abandoned and warmed again at once, not
    after `warming_timeout_seconds` (the three-replica PostgreSQL test timed out waiting for such a box)."""
    engine, clock = FakeEngine(BOX_IDS), FakeClock()
    one = replica(url, "one", engine, clock)

    async def scenario() -> None:
        await one.beat()
        engine.gate = asyncio.Event()  # the prefix warms wait at the engine
        for _ in range(20):
            await one.reconciler.tick()
            await asyncio.sleep(0.01)
            if one.reconciler._runner.in_flight:
                break
        assert one.reconciler._runner.in_flight, "a warm in flight"
        clock.t += LEASES.lease_seconds - LEASES.local_margin_seconds / 2  # past the local deadline
        one.ownership._report()  # what the heartbeat task reports when it wakes at the deadline
        assert one.ownership.owned() == frozenset()
        await one.reconciler.replicas.wait_cancelled()
        await one.beat()  # renewed in time for the database: the same holding goes on
        assert one.ownership.owned() == set(BOX_IDS)
        engine.gate.set()
        engine.gate = None
        await settle(one)  # the rows left `warming` are abandoned at once (failed: the retry backoff)...
        clock.t += RetryBackoff().initial_seconds + 1.0
        await one.beat()
        await settle(one)  # ...and warmed again after it, not after the 300 s warming timeout

    asyncio.run(scenario())
    assert one.reconciler.ready_box_ids() == set(BOX_IDS)


def alone(url: str, engine: FakeEngine, clock: FakeClock) -> Reconciler:
    """One daemon on its own SQLite file: every box trivially its own, deploy state from the store."""
    store = SqlStore.from_url(url, now=clock.now)
    gate = ReplicaGate(ownership=SoleOwnership("solo"), coordination=SqlCoordination(store))
    return Reconciler(
        engine=engine,
        store=store,
        clock=clock,
        boxes=boxes(*BOX_IDS),
        profiles={"m": PROFILE},
        agents={"sales": agent("sales")},
        prefix_source=FakePrefixSource(),
        replicas=gate,
    )


def test_a_restarted_daemon_keeps_a_rollout_in_progress_and_the_fleet_changes(url: str) -> None:
    engine, clock = FakeEngine((*BOX_IDS, "b5")), FakeClock()

    async def scenario() -> Reconciler:
        first = alone(url, engine, clock)
        await first.tick()
        coordination = SqlCoordination(SqlStore.from_url(url, now=clock.now))
        assert await coordination.apply_deploy(
            "ev-1", "rollout.started", "s", 1.0, StateChange(drain={"b1": "r"})
        )
        added = boxes("b5")[0]
        assert await coordination.apply_deploy("ev-2", "box.added", "s", 2.0, StateChange(add=added))
        assert await coordination.apply_deploy("ev-3", "box.removed", "s", 3.0, StateChange(remove="b4"))
        await first.close()
        second = alone(url, engine, clock)  # the daemon restarted
        await second.tick()
        await second.close()
        return second

    second = asyncio.run(scenario())
    assert second.draining() == {"b1": "r"}
    assert sorted(second.fleet()) == ["b1", "b2", "b3", "b5"]


class ListenerFirst(SqlCoordination):
    """The stored deploy change is applied by the replica's own pass (its change listener woke it) the
    moment the transaction commits, before the webhook handler goes on: the order several PostgreSQL
    replicas showed for `box.added`."""

    reconciler: Reconciler | None = None

    async def apply_deploy(
        self, event_id: str, kind: str, body_sha256: str, at: float, change: StateChange
    ) -> bool:
        stored = await super().apply_deploy(event_id, kind, body_sha256, at, change)
        if stored and self.reconciler is not None:
            await self.reconciler.tick()
        return stored


@pytest.mark.parametrize("kind", ["box.added", "box.removed"])
def test_a_fleet_change_its_own_listener_applied_first_is_accepted_not_refused(url: str, kind: str) -> None:
    """The receiver answered 422 "already registered ... send the corrected event with a new id" for an event
    it had just applied, and the advised resend was refused again: a repeat-safe pipeline could not add a
    box through that replica."""
    engine, clock = FakeEngine((*BOX_IDS, "b5")), FakeClock()

    async def scenario() -> tuple[DeployResult, Reconciler]:
        store = SqlStore.from_url(url, now=clock.now)
        coordination = ListenerFirst(store)
        gate = ReplicaGate(ownership=SoleOwnership("solo"), coordination=coordination)
        reconciler = Reconciler(
            engine=engine,
            store=store,
            clock=clock,
            boxes=boxes(*BOX_IDS),
            profiles={"m": PROFILE},
            agents={"sales": agent("sales")},
            prefix_source=FakePrefixSource(),
            replicas=gate,
        )
        coordination.reconciler = reconciler
        await reconciler.tick()
        service = DeployService(
            store=store,
            clock=clock,
            config=WebhookConfig(
                secrets=(SECRET,),
                tolerance_seconds=300.0,
                box_url_policy=BoxUrlPolicy(("http://10.0.9.*:8080",)),
            ),
            fleet=reconciler,
            shared=coordination,
        )
        fields: dict[str, object] = (
            {
                "box": {
                    "id": "b5",
                    "base_url": "http://10.0.9.5:8080",
                    "engine": "llamacpp",
                    "model": "m",
                    "slots": 2,
                }
            }
            if kind == "box.added"
            else {"box_id": "b4"}
        )
        body = json.dumps(
            {"id": "ev-1", "kind": kind, "occurred_at": "2025-01-31T12:00:00Z", **fields}
        ).encode()
        result = await service.handle(body, sign_body(body, SECRET, int(clock.now())))
        await reconciler.close()
        return result, reconciler

    result, reconciler = asyncio.run(scenario())
    assert result.outcome is DeployOutcome.ACCEPTED, result.detail
    fleet = sorted(reconciler.fleet())
    assert fleet == (["b1", "b2", "b3", "b4", "b5"] if kind == "box.added" else ["b1", "b2", "b3"])
