"""Health and epoch polled by a box's lease holder only (issue 22): two real Reconcilers as two replicas,
each over its own counting view of one FakeEngine, with the seams faked: who holds which box
(`FakeOwnership`, one lease table both read) and the observations' store (`FakeExchange`, aged by the fake
clock as the database ages them by its own). Warm state is a shared SQLite file, as in
test_replica_reconcilers.

What must hold: a replica sends no health or epoch request to a box another live replica holds, and
takes the box's state from the holder's observation; a stale observation (the holder stopped polling)
takes the box out of readiness; a box without a live holder, or any box while the store cannot be read,
is polled here; a restart reaches the other replica after one holder poll and one read; a pass does not
poll again what the health timer just polled, but polls a lease just gained at once."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.unit.reconciler_fakes import (
    CountingEngine,
    FakeClock,
    FakeEngine,
    replica_reconciler,
)
from warmer.adapters.engines.dispatch import EngineDispatcher
from warmer.adapters.engines.http import count_control_requests
from warmer.adapters.engines.llamacpp import LlamaCppEngine
from warmer.adapters.store import SqlStore, upgrade_database
from warmer.adapters.store.coordination import SqlCoordination
from warmer.config.settings import Settings
from warmer.core.errors import HealthFailure, StoreUnavailable
from warmer.core.model import BoxSpec, EngineKind
from warmer.core.observations import HealthObservation, StoredObservation
from warmer.service.reconciler import Reconciler
from warmer.service.reconciler.health_sharing import restart_bound_seconds
from warmer.service.replicas.replica_gate import ReplicaGate

BOX_IDS = ("b1", "b2", "b3", "b4")
STALE_AFTER = 15.0
POLL_SECONDS = 5.0


@dataclass
class Leases:
    """The lease table both replicas read: box -> live holder (None: released or expired)."""

    owners: dict[str, str | None]


class FakeOwnership:
    """A LeaseHolder over `Leases`: what a heartbeat would have read, without one."""

    def __init__(self, replica_id: str, leases: Leases) -> None:
        self._id, self._leases = replica_id, leases

    @property
    def replica_id(self) -> str:
        return self._id

    def owns(self, box_id: str) -> bool:
        return self._leases.owners.get(box_id) == self._id

    def owner_of(self, box_id: str) -> str | None:
        return self._leases.owners.get(box_id)

    def trusted_after(self, box_id: str, started_at: float) -> float:
        if self.owns(box_id):
            return started_at
        return 0.0 if self.owner_of(box_id) is not None else math.inf


@dataclass
class FakeExchange:
    """The store's observations, as SqlHealthExchange keeps them: rows written by holders only, one
    stamp per replica, aged by `clock`; `down` makes every call fail as a database outage does."""

    clock: FakeClock
    leases: Leases
    rows: dict[str, tuple[HealthObservation, str]] = field(default_factory=dict)
    stamps: dict[str, float] = field(default_factory=dict)
    rows_written: int = 0
    stamps_written: int = 0
    down: bool = False

    async def publish(
        self, replica_id: str, changed: Mapping[str, HealthObservation], *, stamp: bool
    ) -> frozenset[str]:
        if self.down:
            raise StoreUnavailable("database unavailable")
        held = frozenset(b for b in changed if self.leases.owners.get(b) == replica_id)
        for box_id in held:
            self.rows[box_id] = (changed[box_id], replica_id)
        self.rows_written += len(held)
        if stamp:
            self.stamps[replica_id] = self.clock.now()
            self.stamps_written += 1
        return held

    async def read(self, box_ids: Collection[str]) -> dict[str, StoredObservation]:
        if self.down:
            raise StoreUnavailable("database unavailable")
        found = {}
        for box_id in box_ids:
            if box_id not in self.rows:
                continue
            seen, observer = self.rows[box_id]
            stamped = self.stamps.get(observer)
            found[box_id] = StoredObservation(
                box_id=box_id,
                observation=seen,
                observer=observer,
                age_seconds=None if stamped is None else self.clock.now() - stamped,
                held_by_observer=self.leases.owners.get(box_id) == observer,
            )
        return found


@dataclass
class Replica:
    reconciler: Reconciler
    engine: CountingEngine


@dataclass
class Fleet:
    one: Replica
    two: Replica
    engine: FakeEngine
    clock: FakeClock
    leases: Leases
    exchange: FakeExchange


def make_fleet(url: str, *, poll_seconds: float = 0.0) -> Fleet:
    clock = FakeClock()
    engine = FakeEngine(BOX_IDS)
    engine.clock = clock
    leases = Leases({"b1": "one", "b2": "one", "b3": "two", "b4": "two"})
    exchange = FakeExchange(clock, leases)

    def replica(name: str) -> Replica:
        store = SqlStore.from_url(url, now=clock.now)
        counting = CountingEngine(engine)
        gate = ReplicaGate(
            ownership=FakeOwnership(name, leases),
            coordination=SqlCoordination(store),
            health=exchange,
            stale_after_seconds=STALE_AFTER,
        )
        reconciler = replica_reconciler(
            counting, store, clock, BOX_IDS, gate, health_poll_seconds=poll_seconds
        )
        return Replica(reconciler, counting)

    return Fleet(replica("one"), replica("two"), engine, clock, leases, exchange)


async def settle(fleet: Fleet, rounds: int = 6) -> None:
    for _ in range(rounds):
        for each in (fleet.one, fleet.two):
            await each.reconciler.tick()
            await each.reconciler.wait_idle()


@pytest.fixture
def url(tmp_path: Path) -> str:
    database = f"sqlite:///{tmp_path / 'warmer.db'}"
    upgrade_database(database)
    return database


def test_a_replica_polls_only_the_boxes_it_holds_and_reads_the_others_from_their_holder(url: str) -> None:
    fleet = make_fleet(url)
    asyncio.run(settle(fleet))
    assert fleet.one.engine.polled() == {"b1", "b2"}
    assert fleet.two.engine.polled() == {"b3", "b4"}
    for replica in (fleet.one, fleet.two):
        assert replica.reconciler.ready_box_ids() == set(BOX_IDS)
        live = replica.reconciler.snapshot().live
        assert {b: live[b].epoch for b in BOX_IDS} == dict.fromkeys(BOX_IDS, "gen-0")


def test_rounds_without_a_change_write_a_stamp_not_a_row_per_box(url: str) -> None:
    fleet = make_fleet(url)
    asyncio.run(settle(fleet))
    rows, stamps = fleet.exchange.rows_written, fleet.exchange.stamps_written
    assert rows == len(BOX_IDS)  # each box's first observation, once, by its holder
    asyncio.run(settle(fleet, rounds=3))
    assert fleet.exchange.rows_written == rows
    assert fleet.exchange.stamps_written == stamps + 2 * 3


def test_a_holder_that_stops_polling_takes_its_boxes_out_of_readiness_elsewhere(url: str) -> None:
    fleet = make_fleet(url)
    asyncio.run(settle(fleet))
    before = Counter(fleet.one.engine.polls)

    async def only_one_polls() -> None:
        fleet.clock.t += STALE_AFTER + 1  # replica two is wedged: it holds b3, b4 but polls nothing
        await fleet.one.reconciler.poll_health()

    asyncio.run(only_one_polls())
    assert fleet.one.reconciler.ready_box_ids() == {"b1", "b2"}
    live = fleet.one.reconciler.snapshot().live
    assert live["b3"].health_error_kind is HealthFailure.STALE
    assert live["b3"].health_error is not None
    assert "two" in live["b3"].health_error
    assert {b for (b, _k), n in fleet.one.engine.polls.items() if n > before[(b, _k)]} == {"b1", "b2"}


def test_a_box_without_a_live_holder_is_polled_here(url: str) -> None:
    fleet = make_fleet(url)
    asyncio.run(settle(fleet))
    fleet.leases.owners["b3"] = None  # replica two's lease of b3 expired; nobody took it yet
    fleet.engine.restart("b3")
    asyncio.run(fleet.one.reconciler.poll_health())
    assert "b3" in fleet.one.engine.polled()
    assert "b4" not in fleet.one.engine.polled()
    assert fleet.one.reconciler.snapshot().live["b3"].epoch == "gen-1"  # its own poll saw the restart


def test_every_box_is_polled_here_while_the_store_cannot_be_read(url: str) -> None:
    fleet = make_fleet(url)
    asyncio.run(settle(fleet))
    fleet.exchange.down = True
    fleet.engine.restart("b4")
    asyncio.run(fleet.one.reconciler.poll_health())
    assert fleet.one.engine.polled() == set(BOX_IDS)
    assert fleet.one.reconciler.snapshot().live["b4"].epoch == "gen-1"
    assert "b4" not in (fleet.one.reconciler.ready_box_ids() or set())


def test_a_restart_leaves_readiness_elsewhere_after_one_holder_poll_and_one_read(url: str) -> None:
    fleet = make_fleet(url, poll_seconds=POLL_SECONDS)
    asyncio.run(settle(fleet))
    assert restart_bound_seconds(POLL_SECONDS) == 2 * POLL_SECONDS
    b3_polls = fleet.two.engine.polls[("b3", "health")]

    async def timers() -> None:
        fleet.engine.restart("b3")
        fleet.clock.t += POLL_SECONDS
        await fleet.two.reconciler.poll_health()  # the holder's next poll: it sees the new process
        assert "b3" not in (fleet.two.reconciler.ready_box_ids() or set())
        await fleet.one.reconciler.poll_health()  # the other replica's next read

    asyncio.run(timers())
    assert "b3" not in (fleet.one.reconciler.ready_box_ids() or set())
    assert fleet.one.reconciler.snapshot().live["b3"].epoch == "gen-1"
    assert ("b3", "health") not in fleet.one.engine.polls
    assert fleet.two.engine.polls[("b3", "health")] == b3_polls + 1


def test_a_pass_does_not_poll_again_what_the_timer_just_polled_but_polls_a_gained_lease(url: str) -> None:
    fleet = make_fleet(url, poll_seconds=POLL_SECONDS)
    asyncio.run(settle(fleet))

    async def a_timer_then_passes() -> None:
        fleet.clock.t += POLL_SECONDS
        await fleet.one.reconciler.poll_health()
        await fleet.one.reconciler.tick()
        await fleet.one.reconciler.tick()

    before = Counter(fleet.one.engine.polls)
    asyncio.run(a_timer_then_passes())
    assert {k: n - before[k] for k, n in fleet.one.engine.polls.items()} == {
        (b, kind): 1 for b in ("b1", "b2") for kind in ("health", "epoch")
    }
    fleet.leases.owners["b3"] = "one"  # handed over: the gain's pass polls it at once
    asyncio.run(fleet.one.reconciler.tick())
    assert fleet.one.engine.polls[("b3", "health")] == 1
    assert fleet.exchange.rows["b3"][1] == "one"


def test_a_restart_seen_by_a_recheck_is_not_undone_by_the_holders_older_observation(url: str) -> None:
    fleet = make_fleet(url)
    asyncio.run(settle(fleet))

    async def recheck_then_read() -> None:
        fleet.engine.restart("b3")
        await fleet.one.reconciler.recheck_box("b3")  # a caller met trouble on b3
        await fleet.one.reconciler.poll_health()  # its holder has not polled since: gen-0, fresh

    asyncio.run(recheck_then_read())
    live = fleet.one.reconciler.snapshot().live["b3"]
    assert live.epoch == "gen-1"
    assert "b3" not in (fleet.one.reconciler.ready_box_ids() or set())
    asyncio.run(fleet.two.reconciler.poll_health())  # the holder sees the restart too
    asyncio.run(fleet.one.reconciler.poll_health())
    assert fleet.one.reconciler.snapshot().live["b3"].healthy


def test_the_staleness_bound_is_validated() -> None:
    with pytest.raises(ValueError, match="at least twice"):
        Settings.model_validate({"replicas": {"observation_stale_seconds": 9}})
    assert Settings.model_validate({"replicas": {"observation_stale_seconds": 10}})
    with pytest.raises(ValueError, match="> 0"):
        ReplicaGate(ownership=FakeOwnership("x", Leases({})), coordination=None, stale_after_seconds=0)  # type: ignore[arg-type]


def test_control_requests_are_counted_by_kind_where_they_are_sent() -> None:
    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if request.url.path == "/props":
            return httpx.Response(200, json={"total_slots": 2, "media_marker": "m1", "model_path": "x"})
        return httpx.Response(200, json={"choices": [{"text": "x"}]})

    counted: Counter[str] = Counter()

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            count_control_requests(client, lambda kind: counted.update([kind]))
            box = BoxSpec(id="b1", base_url="http://box.test", engine=EngineKind.LLAMACPP, model="m", slots=2)
            engines = EngineDispatcher({EngineKind.LLAMACPP: LlamaCppEngine(client)}, boxes=[box])
            assert await engines.health(box)
            await engines.epoch(box)
            await engines.capacity(box)
            await client.get("http://box.test/v1/other")  # not a control read: not counted

    asyncio.run(scenario())
    assert counted == {"health": 1, "epoch": 1, "capacity": 1}
    assert sent == ["/health", "/props", "/props", "/v1/other"]
