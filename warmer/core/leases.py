"""Box leases: which replica sends a box its warm, restart warm-up and probe work, and when another may
take over. Pure rules; the store applies them inside one transaction per heartbeat.

Every replica answers the API for every box, but only the holder of a box's lease spends engine work on
it, health and epoch polls included (`warmer.core.observations`: the others read what it saw), so several
replicas warm each (box, epoch, prefix) once and poll each box once per interval, not once each. Polling
follows the lease at once: a box without a live holder is polled by every replica that sees it so, and the
replica that takes it polls it in the pass its gain wakes.

- A lease lasts `lease_seconds` from its last renewal; the holder renews every `renew_seconds`, so it
  survives `lease_seconds / renew_seconds - 1` missed heartbeats (default 15 s / 5 s: two).
- A replica is live while its own heartbeat row has not expired (renewed with its leases). The fair share
  is ceil(boxes / live replicas): a replica never takes boxes beyond it, and hands back what it holds
  beyond it (a replica joined), the boxes it is least preferred for first, but never a box it is busy
  with (a restart warm-up or a warm in flight): that one goes at a later heartbeat, once idle, so a
  hand-over never cuts work short for the next holder to repeat.
- Free boxes (never leased, released, or expired) are taken in rendezvous order, so replicas starting
  together take different boxes first, and the same replica tends to get the same boxes back.
- Takeover bound: a killed holder's leases expire at most `lease_seconds` after its last renewal, and a
  survivor's next heartbeat (at most `renew_seconds` later) takes them: `takeover_bound_seconds`. A holder
  stopping gracefully releases at once, so survivors take its boxes at their next heartbeat.
- Trust follows the holding, `acquired_at`: it carries over when the holding is continuous (a holder whose
  lease lapsed takes the box back before anyone else did; a live holder handed it over, never mid-work),
  and a new holding starts when a lease expired under another replica: its taker re-probes what was
  verified before, and no replica routes on it meanwhile.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    lease_seconds: float = 15.0
    renew_seconds: float = 5.0

    def __post_init__(self) -> None:
        if self.renew_seconds <= 0:
            raise ValueError("renew_seconds must be > 0")
        if self.lease_seconds < 2 * self.renew_seconds:
            raise ValueError(
                "lease_seconds must be at least twice renew_seconds (one missed renewal is not a loss)"
            )

    @property
    def takeover_bound_seconds(self) -> float:
        """Longest time from a holder's death to another replica holding its boxes."""
        return self.lease_seconds + self.renew_seconds

    @property
    def local_margin_seconds(self) -> float:
        """A holder stops treating a lease as its own this long before the database would let it expire, so
        two replicas never both act on one box while clocks tick at slightly different rates."""
        return min(1.0, self.lease_seconds * 0.1)


@dataclass(frozen=True, slots=True)
class Lease:
    """One box's lease row. `acquired_at` (the holder's clock) is when the current or last holder took it:
    warm records verified before it were verified by someone else and are re-probed by the holder."""

    box_id: str
    owner: str | None
    acquired_at: float | None
    expires_at: float  # database clock

    def live_owner(self, now: float) -> str | None:
        """The holder while the lease runs, else None (released or expired)."""
        return self.owner if self.owner is not None and self.expires_at > now else None


@dataclass(frozen=True, slots=True)
class LeaseView:
    """Every lease and live replica as of `now` (database clock), as one heartbeat saw them."""

    now: float
    leases: Mapping[str, Lease] = field(default_factory=dict)
    live_replicas: frozenset[str] = frozenset()

    def held_by(self, replica_id: str) -> frozenset[str]:
        return frozenset(b for b, lease in self.leases.items() if lease.live_owner(self.now) == replica_id)

    def owner_of(self, box_id: str) -> str | None:
        lease = self.leases.get(box_id)
        return None if lease is None else lease.live_owner(self.now)


@dataclass(frozen=True, slots=True)
class LeaseDecision:
    """What one heartbeat does: renew the leases kept, give back the excess, try to take free boxes."""

    renew: frozenset[str]
    release: frozenset[str]
    take: tuple[str, ...]  # most wanted first; the store skips any another replica got first


def preference(box_id: str, replica_id: str) -> int:
    """Rendezvous weight of (box, replica): higher is more preferred; the same on every replica."""
    digest = hashlib.sha256(f"{box_id}\x00{replica_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def fair_share(boxes: int, replicas: int) -> int:
    return math.ceil(boxes / max(1, replicas))


def rendezvous_owner(box_id: str, replicas: Collection[str]) -> str | None:
    return max(replicas, key=lambda r: (preference(box_id, r), r), default=None)


def decide(me: str, boxes: Collection[str], view: LeaseView, busy: Collection[str] = ()) -> LeaseDecision:
    """The heartbeat's decision for replica `me` over the fleet `boxes`, given the leases as they are;
    `busy`: boxes `me` has work in flight on (kept even beyond the share, until idle)."""
    live = set(view.live_replicas) | {me}
    share = fair_share(len(boxes), len(live))

    def rank(box_id: str) -> tuple[bool, int, str]:
        # boxes whose rendezvous owner is `me` first, then by my own preference; ties by id
        return (rendezvous_owner(box_id, live) == me, preference(box_id, me), box_id)

    working = set(busy)
    mine = sorted(
        (b for b in boxes if view.owner_of(b) == me), key=lambda b: (b in working, *rank(b)), reverse=True
    )
    kept = max(share, sum(1 for b in mine if b in working))
    keep, excess = mine[:kept], mine[kept:]
    free = sorted((b for b in boxes if view.owner_of(b) is None), key=rank, reverse=True)
    room = max(0, share - len(keep))
    return LeaseDecision(renew=frozenset(keep), release=frozenset(excess), take=tuple(free[:room]))
