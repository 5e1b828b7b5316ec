"""BoxOwnership over a real SqlCoordination (temp SQLite, the fake clock driving both the replica and the
store): what a replica holds, when it stops counting a lease as its own, and its hand-back on stop."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from tests.unit.reconciler_fakes import FakeClock
from warmer.adapters.store import SqlStore, upgrade_database
from warmer.adapters.store.coordination import SqlCoordination
from warmer.core.errors import StoreUnavailable
from warmer.core.leases import LeaseConfig, LeaseView
from warmer.service.replicas.ownership import BoxOwnership, default_replica_id

BOXES = ("b1", "b2", "b3")
CONFIG = LeaseConfig(lease_seconds=15.0, renew_seconds=5.0)


class FlakyCoordination(SqlCoordination):
    """The real coordination, with a switch that makes its heartbeat fail as an unreachable database."""

    down = False

    async def heartbeat(self, *args: object, **kwargs: object) -> LeaseView:
        if self.down:
            raise StoreUnavailable("database unavailable: test outage")
        return await super().heartbeat(*args, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def url(tmp_path: Path) -> str:
    database = f"sqlite:///{tmp_path / 'warmer.db'}"
    upgrade_database(database)
    return database


def ownership(
    url: str, clock: FakeClock, name: str, changes: list[tuple[set[str], set[str]]] | None = None
) -> tuple[BoxOwnership, FlakyCoordination]:
    coordination = FlakyCoordination(SqlStore.from_url(url, now=clock.now))

    def on_change(gained: frozenset[str], lost: frozenset[str]) -> None:
        if changes is not None:
            changes.append((set(gained), set(lost)))

    owner = BoxOwnership(
        coordination=coordination,
        clock=clock,
        config=CONFIG,
        fleet=lambda: BOXES,
        replica_id=name,
        on_change=on_change,
    )
    return owner, coordination


def test_default_replica_ids_differ_per_start() -> None:
    assert default_replica_id() != default_replica_id()


def test_a_lone_replica_owns_every_box_after_its_first_heartbeat(url: str) -> None:
    clock = FakeClock()
    changes: list[tuple[set[str], set[str]]] = []
    owner, _ = ownership(url, clock, "r1", changes)
    assert not owner.owns("b1")
    asyncio.run(owner.beat())
    assert owner.owned() == set(BOXES)
    assert changes == [(set(BOXES), set())]
    assert owner.owner_of("b2") == "r1"


def test_a_replica_that_cannot_renew_stops_acting_before_its_leases_expire(url: str) -> None:
    clock = FakeClock()
    changes: list[tuple[set[str], set[str]]] = []
    owner, coordination = ownership(url, clock, "r1", changes)
    asyncio.run(owner.beat())
    coordination.down = True
    clock.t += CONFIG.lease_seconds - CONFIG.local_margin_seconds - 0.5
    with pytest.raises(StoreUnavailable):
        asyncio.run(owner.beat())
    assert owner.owns("b1")  # still inside the local deadline
    clock.t += 0.5
    with pytest.raises(StoreUnavailable):
        asyncio.run(owner.beat())
    assert owner.owned() == frozenset()
    assert changes[-1] == (set(), set(BOXES))
    # the database would still call the leases held: the replica gave them up first
    view = asyncio.run(SqlCoordination(SqlStore.from_url(url, now=clock.now)).lease_view())
    assert view.held_by("r1") == set(BOXES)


def test_a_dead_holders_boxes_are_taken_within_the_bound(url: str) -> None:
    clock = FakeClock()
    dead, _ = ownership(url, clock, "dead")
    alive, _ = ownership(url, clock, "alive")
    asyncio.run(dead.beat())
    asyncio.run(alive.beat())
    assert alive.owned() == frozenset()
    clock.t += CONFIG.lease_seconds  # the dead holder never renews again
    asyncio.run(alive.beat())
    assert alive.owned() == set(BOXES)


def test_trust_follows_the_holder_and_its_acquisition(url: str) -> None:
    clock = FakeClock()
    holder, _ = ownership(url, clock, "holder")
    other, _ = ownership(url, clock, "other")
    assert other.trusted_after("b1", started_at=5.0) == math.inf  # nothing known: trust nothing
    acquired = clock.now()
    asyncio.run(holder.beat())
    asyncio.run(other.beat())
    assert other.trusted_after("b1", started_at=0.0) == acquired  # what the holder verified while holding
    assert holder.trusted_after("b1", started_at=acquired + 7.0) == acquired + 7.0  # and not before its start


def test_stopping_gives_every_lease_back_at_once(url: str) -> None:
    clock = FakeClock()
    staying, _ = ownership(url, clock, "staying")

    async def run_then_stop() -> BoxOwnership:
        stopping = asyncio.Event()
        leaving = BoxOwnership(
            coordination=SqlCoordination(SqlStore.from_url(url, now=clock.now)),
            clock=clock,
            config=CONFIG,
            fleet=lambda: BOXES,
            replica_id="leaving",
            on_change=lambda gained, _lost: stopping.set() if gained else None,
        )
        await leaving.run(stopping)  # its first heartbeat takes every box, then it stops
        return leaving

    leaving = asyncio.run(run_then_stop())

    assert leaving.owned() == frozenset()
    asyncio.run(staying.beat())
    assert staying.owned() == set(BOXES)
