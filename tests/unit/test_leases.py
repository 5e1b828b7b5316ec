"""Lease rules (warmer.core.leases): fair share, takeover of free and expired boxes, handing back."""

from __future__ import annotations

import pytest

from warmer.core.leases import (
    Lease,
    LeaseConfig,
    LeaseView,
    decide,
    fair_share,
    preference,
    rendezvous_owner,
)

BOXES = [f"box-{n}" for n in range(6)]


def view(
    now: float, owners: dict[str, str | None], replicas: set[str], *, expires: float = 100.0
) -> LeaseView:
    leases = {b: Lease(b, owner, 1.0 if owner else None, expires) for b, owner in owners.items()}
    return LeaseView(now=now, leases=leases, live_replicas=frozenset(replicas))


def test_config_needs_a_lease_of_at_least_two_renewals() -> None:
    assert LeaseConfig().takeover_bound_seconds == 20.0
    with pytest.raises(ValueError, match="twice renew_seconds"):
        LeaseConfig(lease_seconds=9.0, renew_seconds=5.0)
    with pytest.raises(ValueError, match="renew_seconds"):
        LeaseConfig(lease_seconds=1.0, renew_seconds=0.0)


def test_fair_share_rounds_up() -> None:
    assert [fair_share(6, r) for r in (1, 2, 4, 6, 7)] == [6, 3, 2, 1, 1]
    assert fair_share(3, 0) == 3  # nobody else is live: a replica counts itself


def test_a_lone_replica_takes_every_free_box() -> None:
    decision = decide("r1", BOXES, view(0.0, {}, set()))
    assert sorted(decision.take) == BOXES
    assert decision.renew == frozenset()
    assert decision.release == frozenset()


def test_replicas_starting_together_prefer_different_boxes() -> None:
    replicas = {"r1", "r2", "r3"}
    takes = {r: decide(r, BOXES, view(0.0, {}, replicas)).take for r in replicas}
    for replica, taken in takes.items():
        assert len(taken) == 2
        # a replica's first choices are the boxes rendezvous gives it, so concurrent takers rarely collide
        winners = [b for b in BOXES if rendezvous_owner(b, replicas) == replica]
        assert (
            list(taken[: len(winners)])
            == sorted(winners, key=lambda b: (preference(b, replica), b), reverse=True)[:2]
        )


def test_boxes_held_by_a_live_replica_are_not_taken() -> None:
    owners: dict[str, str | None] = {b: "r2" for b in BOXES[:3]}
    decision = decide("r1", BOXES, view(0.0, owners, {"r1", "r2"}))
    assert set(decision.take) <= set(BOXES[3:])
    assert len(decision.take) == 3


def test_an_expired_lease_is_free_to_take() -> None:
    owners: dict[str, str | None] = {b: "dead" for b in BOXES}
    decision = decide("r1", BOXES, view(200.0, owners, {"r1"}, expires=150.0))
    assert sorted(decision.take) == BOXES


def test_a_replica_beyond_its_share_releases_the_excess_and_renews_the_rest() -> None:
    owners: dict[str, str | None] = {b: "r1" for b in BOXES}
    decision = decide("r1", BOXES, view(0.0, owners, {"r1", "r2", "r3"}))
    assert len(decision.renew) == 2
    assert len(decision.release) == 4
    assert decision.renew | decision.release == set(BOXES)
    assert decision.take == ()


def test_at_its_share_a_replica_takes_nothing_more() -> None:
    owners: dict[str, str | None] = {BOXES[0]: "r1", BOXES[1]: "r1"}
    decision = decide("r1", BOXES, view(0.0, owners, {"r1", "r2", "r3"}))
    assert decision.take == ()
    assert decision.renew == {BOXES[0], BOXES[1]}


def test_a_view_knows_live_owners_only() -> None:
    seen = view(50.0, {"a": "r1", "b": None}, {"r1"}, expires=60.0)
    assert seen.owner_of("a") == "r1"
    assert seen.owner_of("b") is None
    assert seen.owner_of("missing") is None
    assert seen.held_by("r1") == {"a"}
    later = LeaseView(now=61.0, leases=seen.leases, live_replicas=frozenset())
    assert later.owner_of("a") is None


def test_a_box_with_work_in_flight_is_kept_past_the_share_until_idle() -> None:
    owners: dict[str, str | None] = {b: "r1" for b in BOXES}
    busy = {BOXES[0], BOXES[1], BOXES[2]}
    decision = decide("r1", BOXES, view(0.0, owners, {"r1", "r2", "r3"}), busy)
    assert decision.renew == busy  # three busy boxes kept, though the share is two
    assert decision.release == set(BOXES) - busy
    idle_later = decide("r1", BOXES[:3], view(0.0, owners, {"r1", "r2", "r3"}), {BOXES[0]})
    assert BOXES[0] in idle_later.renew
    assert len(idle_later.renew) == 1
    assert len(idle_later.release) == 2
