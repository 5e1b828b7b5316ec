"""Room lent just in time: a call for an agent with no warm box takes the place of a cooler prefix.

When the fleet holds fewer prefixes than there are agents, placement keeps the most valuable ones
resident and the rest (the tail) have no group. A pre-call ask for a tail agent is a concrete call seconds
away, so its prefix is warmed now, into the room the least valuable prefix of one box gives up: that
prefix stops being vouched for there *before* the warm is sent (so no answer says it is warm while it is
being evicted), the borrower is protected for the loan's length (about a call), and when the loan ends
placement takes the room back. The same shape works for slot engines (one prompt per slot: the victim's
slot is lent) and for token pools (victims leave until the borrower's tokens fit).

Value of a resident prefix = calls per minute × prefix tokens: the prefill it saves a minute. A prefix
whose ready answer was just given (its call's first turn is on its way) never leaves, whatever it is worth.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from warmer.core.model import BoxSpec
from warmer.core.placement.handover import Handover


@dataclass(frozen=True, slots=True)
class Loan:
    """`borrower` holds room on `box_id` until `until` (unix seconds); `victims` gave it up. Until
    `protected_until` (about the time from the answer to the call's first turn) no later loan may take
    it back; after that it is a resident like any other, the cheapest to leave when it is the quietest."""

    box_id: str
    borrower: str
    victims: tuple[str, ...]
    until: float
    protected_until: float = 0.0


@dataclass(frozen=True, slots=True)
class LoanOffer:
    """Where a borrower's prefix would go, and whose prefixes leave that box for it."""

    box_id: str
    victims: tuple[str, ...]
    cost: float  # the victims' value: prefill a minute no longer saved there


def prefix_value(calls_per_minute: float, prefix_tokens: int) -> float:
    """Prefill a resident prefix saves a minute: what keeping it is worth."""
    return max(0.0, calls_per_minute) * max(0, prefix_tokens)


def offer_loan(
    borrower: str,
    borrower_tokens: int,
    candidates: Sequence[BoxSpec],
    held: Mapping[str, Sequence[str]],
    tokens_of: Mapping[str, int],
    value: Callable[[str], float],
    protected: Collection[str],
    tie: Callable[[str], int],
) -> LoanOffer | None:
    """The cheapest room for `borrower` on one of `candidates`, or None when every box is full of
    prefixes that cannot leave (`protected`: borrowers of running loans, prefixes with work in flight).

    `held`: box id -> agents whose prefixes the box keeps now. A box with free room costs nothing; else its
    least valuable unprotected prefixes leave, cheapest first, until the borrower fits (one, where the box
    holds a prompt per slot). Ties go to `tie` (a stable per-box number), so one agent's asks agree."""
    best: LoanOffer | None = None
    best_key: tuple[float, int] | None = None
    for box in candidates:
        kept = [a for a in held.get(box.id, ()) if a != borrower]
        victims = _victims(box, kept, borrower_tokens, tokens_of, value, protected)
        if victims is None:
            continue
        cost = sum(value(a) for a in victims)
        key = (cost, -tie(box.id))
        if best_key is None or key < best_key:
            best, best_key = LoanOffer(box.id, tuple(victims), cost), key
    return best


def side_slot(
    slots: int,
    pinned: Mapping[int, str],
    value: Callable[[str], float],
    protected: Collection[int],
    in_call: Collection[int] = (),
) -> tuple[int, str | None] | None:
    """The slot of a box with `slots` pinnable slots for a request that is no agent's call (a transcript
    summary, a classifier): sent unslotted, the engine would put it where it likes and evict a prefix warmer
    vouches for without anyone knowing. `pinned`: slot -> agent whose prefix it holds; `protected`: slots
    that cannot be lent (work in flight there, a ready answer just given); `in_call`: slots a call may still
    be sending turns to (lent only when every other slot is: that call's next turn would prefill its whole
    conversation again). Among the rest, a slot no prefix holds evicts nothing; else the least valuable
    prefix gives way. (slot, the agent whose prefix it evicts or None), or None when every slot is
    protected."""
    lendable = [
        (slot in in_call, slot in pinned, value(pinned[slot]) if slot in pinned else 0.0, slot)
        for slot in range(slots)
        if slot not in protected
    ]
    if not lendable:
        return None
    slot = min(lendable)[3]
    return slot, pinned.get(slot)


def _victims(
    box: BoxSpec,
    kept: Sequence[str],
    borrower_tokens: int,
    tokens_of: Mapping[str, int],
    value: Callable[[str], float],
    protected: Collection[str],
) -> list[str] | None:
    """Who must leave the box for the borrower to fit (empty: it fits), or None (it cannot)."""
    count_limit = box.prefix_capacity
    token_limit = box.cache_capacity_tokens
    if token_limit is not None and borrower_tokens > token_limit:
        return None
    order = sorted((a for a in kept if a not in protected), key=lambda a: (value(a), a))
    remaining = list(kept)
    victims: list[str] = []

    def fits() -> bool:
        if count_limit is not None and len(remaining) + 1 > count_limit:
            return False
        used = sum(tokens_of.get(a, 0) for a in remaining)
        return token_limit is None or used + borrower_tokens <= token_limit

    while not fits():
        if not order:
            return None
        victim = order.pop(0)
        remaining.remove(victim)
        victims.append(victim)
    return victims


@dataclass(frozen=True, slots=True)
class LentBoxCaps:
    """What keeps a lent box within what it holds: placement's view of the boxes (their caps), each
    agent's priority (calls per minute) and prefix tokens."""

    boxes: Mapping[str, BoxSpec]
    priority: Mapping[str, float] = field(default_factory=dict)
    tokens_of: Mapping[str, int] = field(default_factory=dict)


def apply_loans(
    moving: Handover,
    loans: Sequence[Loan],
    prefix_of: Mapping[str, str],
    warm: Collection[tuple[str, str]],
    caps: LentBoxCaps | None = None,
) -> Handover:
    """The handover with running loans laid over it: each borrower is kept warm on its box (and routed
    there once warm), and the box no longer keeps or routes the victims. Placement itself is untouched,
    so when a loan ends the next pass gives the room back.

    Placement did not count the loans, so a box it gave a new agent meanwhile (a neighbour draining for a
    rollout moves its agents) may now keep more than it holds: the other agents leave it until it fits
    (`caps`), those not yet warm there first, then the quietest. A borrower never does:
    warming anything over it would break the answer that sent its call there."""
    if not loans:
        return moving
    routing = {agent: list(group) for agent, group in moving.routing.items()}
    keep = {agent: list(group) for agent, group in moving.keep_warm.items()}
    for loan in loans:
        for victim in loan.victims:
            routing[victim] = [b for b in routing.get(victim, []) if b != loan.box_id]
            keep[victim] = [b for b in keep.get(victim, []) if b != loan.box_id]
        group = keep.setdefault(loan.borrower, [])
        if loan.box_id not in group:
            group.append(loan.box_id)
        prefix = prefix_of.get(loan.borrower)
        routed = routing.setdefault(loan.borrower, [])
        if prefix is not None and (loan.box_id, prefix) in warm and loan.box_id not in routed:
            routed.append(loan.box_id)
    if caps is not None:
        borrowers = {(loan.box_id, loan.borrower) for loan in loans}
        for box_id in sorted({loan.box_id for loan in loans}):
            box = caps.boxes.get(box_id)
            if box is None:
                continue
            for agent in _over_capacity(box, keep, borrowers, prefix_of, warm, caps.priority, caps.tokens_of):
                routing[agent] = [b for b in routing.get(agent, []) if b != box_id]
                keep[agent] = [b for b in keep.get(agent, []) if b != box_id]
    return Handover(
        routing={agent: tuple(group) for agent, group in routing.items()},
        keep_warm={agent: tuple(group) for agent, group in keep.items()},
        pending=moving.pending,
    )


def _over_capacity(
    box: BoxSpec,
    keep: Mapping[str, Sequence[str]],
    borrowers: Collection[tuple[str, str]],
    prefix_of: Mapping[str, str],
    warm: Collection[tuple[str, str]],
    priority: Mapping[str, float],
    tokens_of: Mapping[str, int],
) -> list[str]:
    """Agents that must leave `box` for what it keeps to fit, borrowers never among them."""
    members = sorted(agent for agent, group in keep.items() if box.id in group)
    count_limit, token_limit = box.prefix_capacity, box.cache_capacity_tokens

    def fits(agents: Sequence[str]) -> bool:
        if count_limit is not None and len(agents) > count_limit:
            return False
        return token_limit is None or sum(tokens_of.get(a, 0) for a in agents) <= token_limit

    def keep_first(agent: str) -> tuple[bool, float, str]:
        held = (box.id, prefix_of.get(agent, "")) in warm
        return (held, priority.get(agent, 0.0), agent)

    leaving: list[str] = []
    movable = sorted((a for a in members if (box.id, a) not in borrowers), key=keep_first)
    remaining = list(members)
    while not fits(remaining) and movable:
        agent = movable.pop(0)
        remaining.remove(agent)
        leaving.append(agent)
    return leaving
