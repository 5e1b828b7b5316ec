"""Just-in-time room for a tail agent's call (`warmer.core.placement.loans`), kept by the reconciler.

A pre-call ask for an agent placement left without a group lends it room on one box of its model: the
victims' records there are released first (their routes on that box go before any byte of the borrower's
warm is sent, so no answer calls a prefix warm while it is being evicted), their pinned slot is reserved
for the borrower, and the loan is laid over the next passes' handover until it ends. While it runs the
victims are not warmed back onto that box, by the planner or by their own asks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping, Sequence

import structlog

from warmer.core.model import BoxCapacity, BoxSpec, WarmState
from warmer.core.placement import Handover, stable_seed
from warmer.core.placement.loans import (
    LentBoxCaps,
    Loan,
    LoanOffer,
    apply_loans,
    offer_loan,
    prefix_value,
)
from warmer.core.warmstate import IllegalTransition, Released, RetryBackoff, transition
from warmer.ports import Clock
from warmer.service.reconciler.records import WarmBook


class PrefixLoans:
    """Running loans: who borrowed room where, until when, and which (box, prefix) pairs gave it up."""

    def __init__(
        self,
        *,
        book: WarmBook,
        clock: Clock,
        lend_seconds: float,
        protect_seconds: float,
        retry: RetryBackoff,
        log: structlog.stdlib.BoundLogger,
    ) -> None:
        self._book = book
        self._clock = clock
        self.lend_seconds = lend_seconds  # 0: never lend (a tail agent's ask is answered cold)
        self.protect_seconds = min(protect_seconds, lend_seconds)  # a borrower's turn 1 is on its way
        self._retry = retry
        self._log = log
        self._loans: list[Loan] = []
        self._lent_prefixes: dict[tuple[str, str], str] = {}  # (box, victim prefix) -> borrower
        self._lock = asyncio.Lock()

    @property
    def enabled(self) -> bool:
        return self.lend_seconds > 0

    def active(self, now: float) -> tuple[Loan, ...]:
        """The loans still running (ended ones are dropped: placement takes their room back)."""
        if any(loan.until <= now for loan in self._loans):
            self._loans = [loan for loan in self._loans if loan.until > now]
            kept = {(loan.box_id, loan.borrower) for loan in self._loans}
            self._lent_prefixes = {k: b for k, b in self._lent_prefixes.items() if (k[0], b) in kept}
        return tuple(self._loans)

    def boxes_of(self, agent_id: str) -> tuple[str, ...]:
        """Boxes where the agent borrows room now."""
        now = self._clock.now()
        return tuple(loan.box_id for loan in self.active(now) if loan.borrower == agent_id)

    def lent_away(self, box_id: str, agent_id: str) -> bool:
        """The agent's room on the box is lent to another agent now: nobody warms it back there."""
        now = self._clock.now()
        return any(loan.box_id == box_id and agent_id in loan.victims for loan in self.active(now))

    def blocks(self, box_id: str, prefix_hash: str) -> bool:
        """A warm of this prefix on this box would evict a running loan's borrower."""
        self.active(self._clock.now())
        return (box_id, prefix_hash) in self._lent_prefixes

    def overlay(
        self,
        moving: Handover,
        prefix_of: Mapping[str, str],
        warm: Collection[tuple[str, str]],
        caps: LentBoxCaps | None = None,
    ) -> Handover:
        """`apply_loans` with the running loans (and, given `caps`, each lent box kept within them)."""
        return apply_loans(moving, self.active(self._clock.now()), prefix_of, warm, caps)

    async def lend(
        self,
        agent_id: str,
        *,
        tokens: int,
        candidates: Sequence[BoxSpec],
        epochs: Mapping[str, str],
        held: Mapping[str, Sequence[str]],
        tokens_of: Mapping[str, int],
        prefix_of: Mapping[str, str],
        volume: Mapping[str, float],
        capacity: Mapping[str, BoxCapacity],
        busy: Callable[[str, str], bool],
        answered: Collection[str] = (),
    ) -> str | None:
        """Lend the agent room on the cheapest candidate box; the box id, or None (nowhere to lend).

        `held`: box -> agents kept there (running loans already laid over it); `busy(box, prefix)`: work
        in flight there (such a prefix cannot leave now); `answered`: agents given an answer within the
        protection window (their first turns are on their way: they never leave)."""
        async with self._lock:
            now = self._clock.now()
            if not self.enabled or self.boxes_of(agent_id):
                return None
            borrowers = {loan.borrower for loan in self.active(now) if loan.protected_until > now}
            busy_agents = {
                agent
                for box in candidates
                for agent in held.get(box.id, ())
                if agent in prefix_of and busy(box.id, prefix_of[agent])
            }
            offer = offer_loan(
                agent_id,
                tokens,
                candidates,
                held,
                tokens_of,
                lambda a: prefix_value(volume.get(a, 0.0), tokens_of.get(a, 0)),
                borrowers | busy_agents | set(answered),
                lambda box_id: stable_seed("lend", agent_id, box_id),
            )
            if offer is None:
                return None
            await self._release_victims(offer, epochs[offer.box_id], prefix_of, agent_id)
            room = capacity.get(offer.box_id)
            key = (offer.box_id, epochs[offer.box_id], prefix_of.get(agent_id, ""))
            # the victim's slot, reserved before the warm is spawned; none free means the box holds more
            # than warmer knows of: lend nothing rather than let the engine pick what to evict. Unless the
            # box is configured to hold more prefixes than slots (a llama.cpp host prompt cache): the
            # others are kept unpinned there, and the borrower is warmed as they are, in the slot the
            # engine picks, which pushes that slot's prompt to host RAM, not out.
            box = next((b for b in candidates if b.id == offer.box_id), None)
            beyond_slots = (
                box is not None
                and room is not None
                and room.pinnable_slots is not None
                and box.prefix_capacity is not None
                and box.prefix_capacity > room.pinnable_slots
            )
            if (
                room is not None
                and room.pinnable_slots
                and self._book.pin_for(key, room, now=now) is None  # not a slot a side request is bound for
                and not beyond_slots
            ):
                self._log.warning("no slot free for a lent warm", agent=agent_id, box=offer.box_id)
                return None
            loan = Loan(
                offer.box_id, agent_id, offer.victims, now + self.lend_seconds, now + self.protect_seconds
            )
            # a victim that was itself a borrower there (past its protection) gives its loan up
            gone = {(offer.box_id, victim) for victim in offer.victims}
            self._loans = [old for old in self._loans if (old.box_id, old.borrower) not in gone]
            self._lent_prefixes = {k: b for k, b in self._lent_prefixes.items() if (k[0], b) not in gone}
            self._loans.append(loan)
            for victim in offer.victims:
                if victim in prefix_of:
                    self._lent_prefixes[(offer.box_id, prefix_of[victim])] = agent_id
            self._log.info(
                "room lent just in time",
                agent=agent_id,
                box=offer.box_id,
                victims=list(offer.victims),
                cost_tokens_per_minute=round(offer.cost),
                until=loan.until,
            )
            return offer.box_id

    async def _release_victims(
        self, offer: LoanOffer, epoch: str, prefix_of: Mapping[str, str], borrower: str
    ) -> None:
        """Each victim stops being vouched for on the box (out of its routes) and gives up its slot."""
        for victim in offer.victims:
            prefix_hash = prefix_of.get(victim)
            if prefix_hash is None:
                continue
            key = (offer.box_id, epoch, prefix_hash)
            record = self._book.get(key)
            if record is not None and record.state is not WarmState.COLD:
                try:
                    released = transition(
                        record, Released(f"room lent to {borrower}"), self._clock.now(), self._retry
                    )
                except IllegalTransition:
                    released = None
                if released is not None:
                    await self._book.write(released, reason=f"room lent to {borrower}", previous=record.state)
            self._book.release_pin(key)
