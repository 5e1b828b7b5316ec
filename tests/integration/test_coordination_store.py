"""Leases, membership and shared deploy state in the real databases (SQLite file and PostgreSQL).

Several `SqlCoordination`s on one database stand for several replicas: each has its own store and so its
own connections, as separate processes would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest

from warmer.adapters.store import SqlStore, upgrade_database
from warmer.adapters.store.coordination import SqlCoordination
from warmer.adapters.store.notify import listen_for_changes
from warmer.core.leases import LeaseConfig
from warmer.core.model import BoxSpec, EngineKind, PhaseName, PhaseRecord
from warmer.core.shared_state import StateChange
from warmer.ports import CoordinationPort

pytestmark = pytest.mark.integration

BOXES = [f"box-{n}" for n in range(6)]
CONFIG = LeaseConfig(lease_seconds=15.0, renew_seconds=5.0)
SHORT = LeaseConfig(lease_seconds=1.0, renew_seconds=0.5)  # expiry within a test
ADDED = BoxSpec(id="new", base_url="http://127.0.0.1:9100", engine=EngineKind.VLLM, model="tiny", slots=3)


@pytest.fixture
def migrated_url(database_url: str) -> str:
    upgrade_database(database_url)
    return database_url


@pytest.fixture
def replicas(migrated_url: str) -> Iterator[Callable[[], SqlCoordination]]:
    """A factory of coordinations, each over its own store (connections) on the test database."""
    stores: list[SqlStore] = []

    def make() -> SqlCoordination:
        store = SqlStore.from_url(migrated_url)
        stores.append(store)
        return SqlCoordination(store)

    yield make
    for store in stores:
        asyncio.run(store.close())


def test_sql_coordination_satisfies_the_port(replicas: Callable[[], SqlCoordination]) -> None:
    async def scenario() -> None:
        coordination: CoordinationPort = replicas()
        assert (await coordination.lease_view()).leases == {}

    asyncio.run(scenario())


def test_a_lone_replica_holds_every_box_and_renews(replicas: Callable[[], SqlCoordination]) -> None:
    async def scenario() -> None:
        one = replicas()
        first = await one.heartbeat("r1", BOXES, at=time.time(), config=CONFIG)
        assert first.held_by("r1") == set(BOXES)
        assert first.live_replicas == {"r1"}
        expiry = {b: first.leases[b].expires_at for b in BOXES}
        acquired = {b: first.leases[b].acquired_at for b in BOXES}
        second = await one.heartbeat("r1", BOXES, at=time.time() + 1, config=CONFIG)
        assert second.held_by("r1") == set(BOXES)
        assert all(second.leases[b].expires_at >= expiry[b] for b in BOXES)
        assert {b: second.leases[b].acquired_at for b in BOXES} == acquired  # renewed, not re-taken

    asyncio.run(scenario())


def test_replicas_split_the_fleet_fairly_and_disjointly(
    replicas: Callable[[], SqlCoordination], database_url: str
) -> None:
    async def scenario() -> None:
        names = ["r1", "r2", "r3"]
        coordinations = {name: replicas() for name in names}
        for _ in range(3):  # membership first, then the fair share settles: three rounds at most
            await asyncio.gather(
                *(c.heartbeat(n, BOXES, at=time.time(), config=CONFIG) for n, c in coordinations.items())
            )
        final = await coordinations["r1"].lease_view()
        held = {name: final.held_by(name) for name in names}
        assert final.live_replicas == set(names)
        assert sorted(b for boxes in held.values() for b in boxes) == BOXES  # every box once
        assert all(len(boxes) == 2 for boxes in held.values()), held

    asyncio.run(scenario())


def test_an_expired_holder_loses_its_boxes_to_a_live_replica(
    replicas: Callable[[], SqlCoordination],
) -> None:
    async def scenario() -> None:
        dead, alive = replicas(), replicas()
        taken = await dead.heartbeat("dead", BOXES, at=1.0, config=SHORT)
        assert taken.held_by("dead") == set(BOXES)
        blocked = await alive.heartbeat("alive", BOXES, at=2.0, config=SHORT)
        assert blocked.held_by("alive") == set()  # the holder is live: nothing to take yet
        await asyncio.sleep(SHORT.lease_seconds + 0.2)
        after = await alive.heartbeat("alive", BOXES, at=5.0, config=SHORT)
        assert after.held_by("alive") == set(BOXES)
        assert after.live_replicas == {"alive"}
        assert {after.leases[b].acquired_at for b in BOXES} == {5.0}

    asyncio.run(scenario())


def test_a_graceful_release_frees_the_boxes_at_once(replicas: Callable[[], SqlCoordination]) -> None:
    async def scenario() -> None:
        leaving, staying = replicas(), replicas()
        await leaving.heartbeat("leaving", BOXES, at=1.0, config=CONFIG)
        await leaving.release("leaving", leave=True)
        view = await staying.heartbeat("staying", BOXES, at=2.0, config=CONFIG)
        assert view.held_by("staying") == set(BOXES)
        assert view.live_replicas == {"staying"}
        # handed over by a live holder, never mid-work: what it verified stays trusted (acquired_at kept)
        assert {view.leases[b].acquired_at for b in BOXES} == {1.0}

    asyncio.run(scenario())


def test_a_joining_replica_gets_the_excess_handed_back(replicas: Callable[[], SqlCoordination]) -> None:
    async def scenario() -> None:
        first, second = replicas(), replicas()
        await first.heartbeat("first", BOXES, at=1.0, config=CONFIG)
        await second.heartbeat("second", BOXES, at=1.0, config=CONFIG)  # counted live; nothing free yet
        handed = await first.heartbeat("first", BOXES, at=2.0, config=CONFIG)
        assert len(handed.held_by("first")) == 3
        joined = await second.heartbeat("second", BOXES, at=3.0, config=CONFIG)
        assert joined.held_by("second") == set(BOXES) - handed.held_by("first")

    asyncio.run(scenario())


def test_phases_for_reads_each_boxs_given_epoch(
    replicas: Callable[[], SqlCoordination], migrated_url: str
) -> None:
    async def scenario() -> None:
        store = SqlStore.from_url(migrated_url)
        try:
            box = BoxSpec(id="a", base_url="http://127.0.0.1:9001", engine=EngineKind.LLAMACPP, model="tiny")
            await store.sync_boxes([box])
            for epoch in ("e1", "e2"):
                await store.record_epoch("a", epoch, 1.0)
                await store.put_phase(
                    PhaseRecord(box_id="a", epoch=epoch, phase=PhaseName.SAMPLED, started_at=1.0)
                )
            found = await replicas().phases_for({"a": "e2", "missing": "x"})
        finally:
            await store.close()
        assert [(p.epoch, p.phase) for p in found["a"]] == [("e2", PhaseName.SAMPLED)]
        assert found["missing"] == []

    asyncio.run(scenario())


def test_apply_deploy_is_atomic_and_idempotent_across_replicas(
    replicas: Callable[[], SqlCoordination],
) -> None:
    async def scenario() -> None:
        one, two = replicas(), replicas()
        drain = StateChange(drain={"a": "rollout in progress (event ev-1)"})
        assert await one.apply_deploy("ev-1", "rollout.started", "sha", 1.0, drain)
        assert not await two.apply_deploy("ev-1", "rollout.started", "sha", 1.0, drain)  # a repeat elsewhere
        state = await two.shared_state()
        assert state.drains() == {"a": "rollout in progress (event ev-1)"}

        assert await two.apply_deploy(
            "ev-2", "rollout.finished", "sha", 2.0, StateChange(undrain={"a": "tag-2"})
        )
        state = await one.shared_state()
        assert state.drains() == {}
        assert state.epoch_tags() == {"a": "tag-2"}
        # a drain keeps the box's tag: its process still runs the tagged epoch until it restarts
        assert await one.apply_deploy(
            "ev-3", "rollout.started", "sha", 3.0, StateChange(drain={"a": "again"})
        )
        assert (await one.shared_state()).epoch_tags() == {"a": "tag-2"}

        assert await one.apply_deploy("ev-4", "box.added", "sha", 4.0, StateChange(add=ADDED))
        assert await two.apply_deploy("ev-5", "box.removed", "sha", 5.0, StateChange(remove="a"))
        state = await two.shared_state()
        assert state.changes["new"].added == ADDED
        assert state.changes["a"].added is None
        assert "a" not in state.rollouts  # a removed box's rollout state goes with it

    asyncio.run(scenario())


def test_concurrent_deliveries_of_one_event_apply_once(replicas: Callable[[], SqlCoordination]) -> None:
    async def scenario() -> None:
        coordinations = [replicas() for _ in range(4)]
        change = StateChange(drain={"a": "rollout"})
        results = await asyncio.gather(
            *(c.apply_deploy("ev", "rollout.started", "s", 1.0, change) for c in coordinations)
        )
        assert sorted(results) == [False, False, False, True]

    asyncio.run(scenario())


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_lease_change_notifies_listening_replicas(
    replicas: Callable[[], SqlCoordination], migrated_url: str
) -> None:
    async def scenario() -> None:
        heard: list[str] = []
        listening = asyncio.Event()
        notified = asyncio.Event()

        def on_change(payload: str) -> None:
            heard.append(payload)
            (listening if payload == "listening" else notified).set()

        stopping = asyncio.Event()
        listener = asyncio.create_task(listen_for_changes(migrated_url, on_change, stopping))
        try:
            await asyncio.wait_for(listening.wait(), 30)
            await replicas().heartbeat("r1", BOXES, at=1.0, config=CONFIG)
            await asyncio.wait_for(notified.wait(), 30)
        finally:
            stopping.set()
            await asyncio.wait_for(listener, 30)
        assert heard[:2] == ["listening", "leases"]

    asyncio.run(scenario())


def test_a_lapsed_lease_taken_back_by_its_holder_keeps_its_acquisition(
    replicas: Callable[[], SqlCoordination],
) -> None:
    async def scenario() -> None:
        one = replicas()
        first = await one.heartbeat("r1", BOXES, at=1.0, config=SHORT)
        await asyncio.sleep(SHORT.lease_seconds + 0.2)  # nobody renewed, nobody else took them
        again = await one.heartbeat("r1", BOXES, at=9.0, config=SHORT)
        assert again.held_by("r1") == set(BOXES)
        assert {again.leases[b].acquired_at for b in BOXES} == {first.leases[BOXES[0]].acquired_at} == {1.0}

    asyncio.run(scenario())
