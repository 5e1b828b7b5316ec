"""The placement algorithm: busiest agents first, incumbent boxes first, coverage before spill room.

Caps are hard: at most `max_agents_per_box` distinct agents per box, no more distinct prefixes than the box's
`prefix_capacity` and no more distinct prefix tokens than its `cache_capacity_tokens` when known (the
engine's own figures, `BoxCapacity`): a box asked to hold more than fits evicts what was just warmed.
Coverage comes before spill room: every agent gets one box before any agent gets a second. An agent that
fits nowhere is reported unplaced with a reason.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence

from warmer.core.model import BoxSpec
from warmer.core.placement.capped import capped_pass
from warmer.core.placement.counted import counted_pass
from warmer.core.placement.demand import Demand, Position, Step, prepare
from warmer.core.placement.ranking import BoxIndex
from warmer.core.placement.types import AgentDemand, Placement, PlacementConfig, UnplacedReason

_NO_LIMIT = 1 << 62  # a cap not known: larger than any count of prefixes or tokens


class _Held:
    """One box in a placement in progress: its agents, its distinct prefixes and their tokens, its caps."""

    __slots__ = ("agents", "exclusive", "model", "open", "prefix_limit", "prefixes", "token_limit", "tokens")

    def __init__(self, box: BoxSpec) -> None:
        self.model = box.model
        self.open = False  # counted in `Fill`'s open boxes of its model (only while tracking)
        self.agents = 0
        self.tokens = 0
        self.prefixes: set[str] = set()
        self.exclusive = False  # a dedicated agent took it: it serves that agent alone
        self.prefix_limit = box.prefix_capacity if box.prefix_capacity is not None else _NO_LIMIT
        self.token_limit = box.cache_capacity_tokens if box.cache_capacity_tokens is not None else _NO_LIMIT


class Fill:
    """What a placement in progress has given each box: agents, distinct prefixes and their tokens.

    One record per box (`_Held`), so a check costs one lookup by box id: the checks are most of a capped
    placement's CPU."""

    def __init__(self, spec: Mapping[str, BoxSpec], config: PlacementConfig, dedicated: Collection[str]):
        self._cap = config.max_agents_per_box
        self._dedicated = dedicated
        self._held = {box_id: _Held(box) for box_id, box in spec.items()}
        self.chosen: dict[str, list[str]] = {}
        self._open: dict[str, int] = {}  # model -> its boxes that may still take a new prefix (`track`)
        self._holders: dict[str, int] = {}  # prefix -> boxes holding it (`track`)

    def track(self, index: BoxIndex) -> None:
        """Count, from here on, each model's boxes that may still take a prefix they do not hold, and the
        boxes holding each prefix (kept by `take_tracked` only). Call on a fresh fill."""
        for box_id, held in self._held.items():
            if box_id in index:
                held.open = True
                self._open[held.model] = self._open.get(held.model, 0) + 1

    def take_tracked(self, agent: AgentDemand, candidates: Iterable[str], need: int) -> None:
        """Each candidate that fits, in order, until the agent has `need` boxes, while some box may still
        take the agent: one that may take a new prefix, or one not the agent's holding its prefix (boxes
        only fill: once none may, none ever will, and the walk stops instead of looking at every box of a
        full fleet). Keeps what `track` counts."""
        aid, key, tokens, model = agent.agent_id, agent.prefix_key, agent.prefix_tokens, agent.model
        dedicated, cap, boxes = aid in self._dedicated, self._cap, self._held
        opened, holders = self._open, self._holders
        chosen = self.chosen.get(aid)
        taken = len(chosen) if chosen else 0
        if taken >= need:
            return
        for box_id in candidates:
            if opened.get(model, 0) <= 0 and holders.get(key, 0) <= taken:
                return
            held = boxes[box_id]
            count = held.agents
            if count >= cap or held.exclusive or (dedicated and count) or (chosen and box_id in chosen):
                continue
            holds = held.prefixes
            if key not in holds:
                if len(holds) >= held.prefix_limit or held.tokens + tokens > held.token_limit:
                    continue
                holds.add(key)
                held.tokens += tokens
                holders[key] = holders.get(key, 0) + 1
            held.agents = count = count + 1
            if dedicated:
                held.exclusive = True
            if held.open and (held.exclusive or count >= cap or len(holds) >= held.prefix_limit):
                held.open = False
                opened[model] -= 1
            if chosen is None:
                chosen = self.chosen[aid] = []
            chosen.append(box_id)
            taken += 1
            if taken >= need:
                return  # before the next candidate: the spill room walks on from there

    def groups(self) -> dict[str, tuple[str, ...]]:
        return {agent_id: tuple(chosen) for agent_id, chosen in self.chosen.items() if chosen}


def coverage_first(demand: Demand, index: BoxIndex, fill: Fill) -> dict[str, UnplacedReason]:
    """Caps bind: every agent gets one box before any agent gets its spill room, so a fleet short of cache
    serves every agent warm somewhere instead of a few agents twice and the rest nowhere. An agent that has
    boxes keeps one if it still fits; one pushed out of its boxes by a busier agent waits until every agent
    has kept what it could, so displacement does not cascade through the fleet."""
    placeable = [agent for agent in demand.ordered if agent.agent_id in demand.incumbents]
    rankings = {agent.agent_id: demand.ranking(index, agent) for agent in placeable}

    fill.track(index)  # where the fleet is short, most walks would look at every box and take none

    def cover(agent: AgentDemand, candidates: Iterator[str] | list[str]) -> None:
        first_pass = demand.wanted[agent.agent_id] if agent.agent_id in demand.dedicated else 1
        fill.take_tracked(agent, candidates, first_pass)

    pushed_out: list[AgentDemand] = []
    for agent in placeable:
        mine = demand.incumbents[agent.agent_id]
        cover(agent, mine or rankings[agent.agent_id])
        if mine and agent.agent_id not in fill.chosen:
            pushed_out.append(agent)
    for agent in pushed_out:
        cover(agent, rankings[agent.agent_id])
    # Then spill room, busiest first: the rest of the agent's boxes, then further down its ranking (boxes
    # skipped above were full then and are fuller now, so the ranking continues where it stopped).
    unplaced = dict(demand.unplaced)
    for agent in placeable:
        chosen = fill.chosen.get(agent.agent_id)
        if not chosen:
            unplaced[agent.agent_id] = UnplacedReason.CAPACITY
            continue
        need = demand.wanted[agent.agent_id]
        fill.take_tracked(agent, _chain(demand.incumbents[agent.agent_id], rankings[agent.agent_id]), need)
    return unplaced


def _short(demand: Demand, spec: Mapping[str, BoxSpec], index: BoxIndex, config: PlacementConfig) -> bool:
    """Whether some model's boxes cannot give each of its agents one box: more agents than their agent caps
    allow, or more distinct prefixes than their prefix caps hold. Then the single pass would fail (an agent
    with a box puts its prefix on it) and coverage comes first at once, without running it to that agent."""
    agents: dict[str, int] = {}
    prefixes: dict[str, set[str]] = {}
    for agent in demand.ordered:
        if agent.agent_id in demand.incumbents:
            agents[agent.model] = agents.get(agent.model, 0) + 1
            prefixes.setdefault(agent.model, set()).add(agent.prefix_key)
    room: dict[str, int] = {}
    slots: dict[str, int | None] = {}
    for box_id, box in spec.items():
        if box_id in index:
            room[box.model] = room.get(box.model, 0) + config.max_agents_per_box
            held = slots.get(box.model, 0)
            limit = box.prefix_capacity
            slots[box.model] = None if held is None or limit is None else held + limit
    for model, count in agents.items():
        limit = slots.get(model)
        if count > room.get(model, 0) or (limit is not None and len(prefixes[model]) > limit):
            return True
    return False


def _chain(first: Sequence[str], rest: Iterator[str]) -> Iterator[str]:
    yield from first
    yield from rest


def index_boxes(
    boxes: Sequence[BoxSpec], eligible: Collection[str] | None, buckets: int, *, keep: bool = True
) -> tuple[BoxIndex, dict[str, BoxSpec]]:
    spec: dict[str, BoxSpec] = {}
    for box in boxes:
        if box.id in spec:
            raise ValueError(f"boxes: duplicate box id {box.id!r}")
        spec[box.id] = box
    allowed = set(eligible) if eligible is not None else None
    index = BoxIndex(buckets, keep=keep)
    for box in boxes:
        if allowed is None or box.id in allowed:
            index.add(box.id, box.model)
    return index, spec


def place(
    boxes: Sequence[BoxSpec],
    agents: Sequence[AgentDemand],
    config: PlacementConfig | None = None,
    *,
    eligible: Collection[str] | None = None,
    previous: Mapping[str, Sequence[str]] | None = None,
) -> Placement:
    """Place every agent. `eligible` (default: all) excludes boxes being drained or not yet admitted.

    `previous` (agent -> the boxes serving it now) keeps the mapping stable where caches are full: an agent
    tries the boxes it already has before its ranking, so a box going away moves its own agents and the
    quieter agents they displace, not everyone whose turn in the busiest-first order changed.
    """
    config = config or PlacementConfig()
    index, spec = index_boxes(boxes, eligible, config.hash_buckets, keep=False)
    placement, _ = place_indexed(spec, index, agents, config, previous)
    return placement


def place_indexed(
    spec: Mapping[str, BoxSpec],
    index: BoxIndex,
    agents: Sequence[AgentDemand],
    config: PlacementConfig,
    previous: Mapping[str, Sequence[str]] | None,
    *,
    seeds: Mapping[str, int] | None = None,
    trace: dict[str, Step] | None = None,
    positions: dict[str, Position] | None = None,
) -> tuple[Placement, bool]:
    """`place` over an index that may hold rankings from earlier calls, and whether the single pass was the
    answer; `trace`, when given, receives each agent's step of that pass (emptied when it was not), and
    `positions` each agent's turn."""
    demand = prepare(agents, config, spec, index, previous, seeds)
    index.prime(
        (agent.agent_id, demand.seeds[agent.agent_id], agent.model)
        for agent in demand.ordered
        if len(demand.incumbents.get(agent.agent_id, ())) < demand.wanted[agent.agent_id]
    )  # the agents that will walk their ranking, hashed at once
    if positions is not None:
        positions.update(demand.positions)
    groups = counted_pass(demand, index, spec, config, trace)  # where only agent counts can refuse
    unplaced, single = demand.unplaced, True
    if groups is None:
        if trace is not None:
            trace.clear()
        short = _short(demand, spec, index, config)
        groups = None if short else capped_pass(demand, index, spec, config, trace)  # caps may bind
        if groups is None:
            single = False
            if trace is not None:
                trace.clear()
            fill = Fill(spec, config, demand.dedicated)
            unplaced = coverage_first(demand, index, fill)
            groups = fill.groups()
    placement = Placement(groups=groups, wanted=demand.wanted, unplaced=unplaced, dedicated=demand.dedicated)
    return placement, single
