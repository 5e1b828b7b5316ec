"""The single pass where prefix or token caps can bind (llama.cpp slots, an engine's KV budget), with each
box's room kept as one number.

Why it is exact: in the general single pass (each agent, in turn order, takes every box that fits from its
boxes now, then from its ranking, until it has its group) a box is refused by its agent cap, by a dedicated
agent holding it (or, for a dedicated agent, by any agent holding it), because the agent has it already,
or — when it does not hold the agent's prefix — by its prefix cap or its token cap. So one number per box
says whether it takes a new prefix of t tokens: its token room, or -1 once its agent or prefix cap is
reached (`room[b] >= t`). A prefix only one agent has is never held already (an agent takes a box once),
so for most agents that number is the whole check; the boxes holding each shared prefix are kept by prefix.
A box's answer depends only on what earlier agents left in it, not on the agent's other boxes (all
distinct), so the boxes are taken after the scan that chose them.

Why: the general pass (a generator per walk, a record per box, every check at every box) cost ~170 ms of
a capped placement of 20,000 agents, over the 0.5 s budget with the plan. Here an agent scans its best
bucket's ranking as a list (where ~5,000 of them meet a full box) and only a walk past that bucket takes
the generator.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from warmer.core.model import BoxSpec
from warmer.core.placement.demand import Demand, Step
from warmer.core.placement.ranking import BoxIndex
from warmer.core.placement.types import AgentDemand, PlacementConfig

_NO_LIMIT = 1 << 62  # a cap not known: larger than any count of prefixes or tokens


class _Room:
    """What a placement in progress has left on each box. Where no prefix is shared and no agent dedicated
    (`plain`), a take needs only `left` and `room`: every take brings a new prefix, so it uses one agent
    and one prefix slot, and `left` (the fewer of the two) is all that can close the box."""

    __slots__ = ("agents", "cap", "holders", "left", "room", "slots", "token_limit", "tokens")

    def __init__(self, spec: Mapping[str, BoxSpec], cap: int) -> None:
        self.cap = cap
        self.agents = dict.fromkeys(spec, 0)
        self.tokens = dict.fromkeys(spec, 0)
        self.slots = {
            b: (s.prefix_capacity if s.prefix_capacity is not None else _NO_LIMIT) for b, s in spec.items()
        }
        self.token_limit = {
            b: (s.cache_capacity_tokens if s.cache_capacity_tokens is not None else _NO_LIMIT)
            for b, s in spec.items()
        }
        self.left = {b: min(cap, slots) for b, slots in self.slots.items()}
        # tokens a new prefix may still bring, or -1 while the box may take no new prefix
        self.room = {b: (self.token_limit[b] if self.left[b] > 0 else -1) for b in spec}
        self.holders: dict[str, set[str]] = {}  # shared prefix -> the boxes holding it

    def fits(self, box_id: str, tokens: int, held: set[str] | None, dedicated: bool) -> bool:
        """Whether the box takes the agent (one of its boxes it does not have yet)."""
        if dedicated:
            return self.agents[box_id] == 0 and self.room[box_id] >= tokens
        if held is not None and box_id in held:
            return self.agents[box_id] < self.cap  # the prefix is held here already: it costs no cache
        return self.room[box_id] >= tokens

    def take(self, box_id: str, key: str, tokens: int, shared: bool, dedicated: bool) -> None:
        """Give the box to the agent (not `plain`)."""
        held = self.holders.get(key) if shared else None
        if held is None or box_id not in held:
            self.slots[box_id] -= 1
            self.tokens[box_id] += tokens
            if shared:
                self.holders.setdefault(key, set()).add(box_id)
        count = self.cap if dedicated else self.agents[box_id] + 1  # dedicated: it serves that agent alone
        self.agents[box_id] = count
        opened = count < self.cap and self.slots[box_id] > 0
        self.room[box_id] = self.token_limit[box_id] - self.tokens[box_id] if opened else -1


def capped_pass(
    demand: Demand,
    index: BoxIndex,
    spec: Mapping[str, BoxSpec],
    config: PlacementConfig,
    trace: dict[str, Step] | None = None,
) -> dict[str, tuple[str, ...]] | None:
    """Every placeable agent's group exactly as the general single pass gives it, in turn order; None when
    some agent got no box (then coverage comes first). `trace`, when given, receives each agent's step
    (partly filled on None)."""
    incumbents, wanted, dedicated, seeds = demand.incumbents, demand.wanted, demand.dedicated, demand.seeds
    placeable = [agent for agent in demand.ordered if agent.agent_id in incumbents]
    keys = [agent.prefix_key for agent in placeable]
    shared = {key for key, count in Counter(keys).items() if count > 1}
    plain = not shared and not dedicated
    fill = _Room(spec, config.max_agents_per_box)
    room, left = fill.room, fill.left
    groups: dict[str, tuple[str, ...]] = {}
    for agent, key in zip(placeable, keys, strict=True):
        aid, tokens = agent.agent_id, agent.prefix_tokens
        step: Step | None = None
        if incumbents[aid] or not (plain or (key not in shared and aid not in dedicated)):
            step = _mine_first(demand, index, agent, fill, fill.holders.get(key) if key in shared else None)
            chosen = step.chosen
        else:  # the usual agent: a prefix of its own, no boxes yet, its best bucket's ranking as a list
            need = wanted[aid]
            first, members = index.first(aid, seeds[aid], agent.model)
            chosen = members[:need]
            fits = len(chosen) == need
            for box_id in chosen:
                if room[box_id] < tokens:
                    fits = False
                    break
            if not fits:
                step = _walk(demand, index, agent, fill, None, first, members)
                chosen = step.chosen
            elif trace is not None:
                step = Step(list(chosen), list(chosen), [first], True)
        if not chosen:
            return None
        if plain:
            for box_id in chosen:  # a new prefix on every box: one agent and one prefix slot less
                rest = left[box_id] - 1
                left[box_id] = rest
                room[box_id] = room[box_id] - tokens if rest > 0 else -1
        else:
            for box_id in chosen:
                fill.take(box_id, key, tokens, key in shared, aid in dedicated)
        groups[aid] = tuple(chosen)
        if trace is not None and step is not None:
            trace[aid] = step
    return groups


def _mine_first(
    demand: Demand, index: BoxIndex, agent: AgentDemand, fill: _Room, held: set[str] | None
) -> Step:
    """The agent's step: its boxes now first (a repeated one is looked at again and skipped), then its
    ranking without them."""
    aid = agent.agent_id
    mine, need = demand.incumbents[aid], demand.wanted[aid]
    tokens, alone = agent.prefix_tokens, aid in demand.dedicated
    step = Step()
    chosen, examined = step.chosen, step.examined
    for box_id in mine:
        examined.append(box_id)
        if box_id not in chosen and fill.fits(box_id, tokens, held, alone):
            chosen.append(box_id)
            if len(chosen) >= need:
                step.complete = True
                return step
    first, members = index.first(aid, demand.seeds[aid], agent.model)
    return _walk(demand, index, agent, fill, held, first, members, step)


def _walk(
    demand: Demand,
    index: BoxIndex,
    agent: AgentDemand,
    fill: _Room,
    held: set[str] | None,
    first: int,
    members: Sequence[str],
    step: Step | None = None,
) -> Step:
    """The agent's ranking without its boxes now, from its best bucket (`members`, a list) on into the
    others: the boxes that fit until it has its group, and what it looked at."""
    aid = agent.agent_id
    mine, need = demand.incumbents[aid], demand.wanted[aid]
    tokens, alone, room = agent.prefix_tokens, aid in demand.dedicated, fill.room
    plain = held is None and not alone
    step = step if step is not None else Step()
    chosen, examined = step.chosen, step.examined
    step.entered.append(first)
    rest = index.walk(aid, demand.seeds[aid], agent.model, step.entered, after_first=True)
    for ranked in (members, rest):
        for box_id in ranked:
            if mine and box_id in mine:
                continue
            examined.append(box_id)
            if room[box_id] >= tokens if plain else fill.fits(box_id, tokens, held, alone):
                chosen.append(box_id)
                if len(chosen) >= need:
                    step.complete = True
                    return step
    return step
