"""The placement as it was before the work on capped fleets (one record per box in `Fill`, coverage first at
once on a short fleet, walks stopped when no box can take the agent): the baseline `bench.plan_scale --caps`
measures the current `place` against, and checks it gives the same placement. Kept verbatim from
warmer/core/placement/greedy.py at 7410853 apart from this docstring."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence

from warmer.core.model import BoxSpec
from warmer.core.placement.counted import counted_pass
from warmer.core.placement.demand import Demand, Position, Step, prepare
from warmer.core.placement.ranking import BoxIndex
from warmer.core.placement.types import AgentDemand, Placement, PlacementConfig, UnplacedReason


class Fill:
    """What a placement in progress has given each box: agents, distinct prefixes and their tokens."""

    def __init__(self, spec: Mapping[str, BoxSpec], config: PlacementConfig, dedicated: Collection[str]):
        self._spec = spec
        self._cap = config.max_agents_per_box
        self._dedicated = dedicated
        self._agents: dict[str, int] = {}
        self._tokens: dict[str, int] = {}
        self._prefixes: dict[str, set[str]] = {}
        self._exclusive: set[str] = set()
        self.chosen: dict[str, list[str]] = {}

    def fits(self, agent: AgentDemand, box_id: str) -> bool:
        if box_id in self.chosen.get(agent.agent_id, ()):
            return False
        count = self._agents.get(box_id, 0)
        if box_id in self._exclusive or count >= self._cap or (agent.agent_id in self._dedicated and count):
            return False
        holds = self._prefixes.get(box_id)
        if holds is not None and agent.prefix_key in holds:
            return True  # the prefix is held here already: another agent sharing it costs no cache
        box = self._spec[box_id]
        if box.prefix_capacity is not None and len(holds or ()) >= box.prefix_capacity:
            return False
        capacity = box.cache_capacity_tokens
        return capacity is None or self._tokens.get(box_id, 0) + agent.prefix_tokens <= capacity

    def take(self, agent: AgentDemand, box_id: str) -> int:
        """Give the box to the agent; returns how many boxes the agent has now."""
        chosen = self.chosen.setdefault(agent.agent_id, [])
        chosen.append(box_id)
        self._agents[box_id] = self._agents.get(box_id, 0) + 1
        holds = self._prefixes.setdefault(box_id, set())
        prefix_key = agent.prefix_key
        if prefix_key not in holds:
            holds.add(prefix_key)
            self._tokens[box_id] = self._tokens.get(box_id, 0) + agent.prefix_tokens
        if agent.agent_id in self._dedicated:
            self._exclusive.add(box_id)
        return len(chosen)

    def take_first(
        self,
        agent: AgentDemand,
        candidates: Iterable[str],
        need: int,
        examined: list[str] | None = None,
        skip: Collection[str] = (),
    ) -> int:
        """`fits` then `take` over the candidates in order until the agent has `need` boxes; returns how
        many it has. One call per agent with the checks inlined: the single pass runs this 20,000 times."""
        aid, key, tokens = agent.agent_id, agent.prefix_key, agent.prefix_tokens
        dedicated, cap, spec = aid in self._dedicated, self._cap, self._spec
        counts, held_tokens, prefixes, exclusive = self._agents, self._tokens, self._prefixes, self._exclusive
        chosen = self.chosen.get(aid)
        for box_id in candidates:
            if skip and box_id in skip:
                continue
            if examined is not None:
                examined.append(box_id)
            count = counts.get(box_id, 0)
            if count >= cap or box_id in exclusive or (dedicated and count) or (chosen and box_id in chosen):
                continue
            holds = prefixes.get(box_id)
            if holds is None or key not in holds:
                box = spec[box_id]
                limit = box.prefix_capacity
                if limit is not None and holds is not None and len(holds) >= limit:
                    continue
                now = held_tokens.get(box_id, 0)
                if box.cache_capacity_tokens is not None and now + tokens > box.cache_capacity_tokens:
                    continue
                if holds is None:
                    holds = prefixes[box_id] = set()
                holds.add(key)
                held_tokens[box_id] = now + tokens
            counts[box_id] = count + 1
            if dedicated:
                exclusive.add(box_id)
            if chosen is None:
                chosen = self.chosen[aid] = []
            chosen.append(box_id)
            if len(chosen) >= need:
                break
        return len(chosen) if chosen else 0

    def groups(self) -> dict[str, tuple[str, ...]]:
        return {agent_id: tuple(chosen) for agent_id, chosen in self.chosen.items() if chosen}


def single_pass(demand: Demand, index: BoxIndex, fill: Fill, trace: dict[str, Step] | None = None) -> bool:
    """Where every agent fits with its whole group (caps do not bind: the usual case at fleet scale), one
    pass in turn order is the answer, each agent's boxes it has first. False when some agent got no box
    (then coverage comes first, `coverage_first`)."""
    for agent in demand.ordered:
        aid = agent.agent_id
        mine = demand.incumbents.get(aid)
        if mine is None:
            continue
        step = Step() if trace is not None else None
        examined = step.examined if step is not None else None
        need = demand.wanted[aid]
        took = fill.take_first(agent, mine, need, examined) if mine else 0
        if took < need:
            walk = index.walk(aid, demand.seeds[aid], agent.model, step.entered if step is not None else None)
            took = fill.take_first(agent, walk, need, examined, skip=mine)
        if step is not None and trace is not None:
            step.chosen, step.complete = list(fill.chosen.get(aid, ())), took == need
            trace[aid] = step
        if not took:
            return False
    return True


def coverage_first(demand: Demand, index: BoxIndex, fill: Fill) -> dict[str, UnplacedReason]:
    """Caps bind: every agent gets one box before any agent gets its spill room, so a fleet short of cache
    serves every agent warm somewhere instead of a few agents twice and the rest nowhere. An agent that has
    boxes keeps one if it still fits; one pushed out of its boxes by a busier agent waits until every agent
    has kept what it could, so displacement does not cascade through the fleet."""
    placeable = [agent for agent in demand.ordered if agent.agent_id in demand.incumbents]
    rankings = {agent.agent_id: demand.ranking(index, agent) for agent in placeable}

    def cover(agent: AgentDemand, candidates: Iterator[str] | list[str]) -> None:
        first_pass = demand.wanted[agent.agent_id] if agent.agent_id in demand.dedicated else 1
        for box_id in candidates:
            if fill.fits(agent, box_id) and fill.take(agent, box_id) >= first_pass:
                return

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
        for box_id in _chain(demand.incumbents[agent.agent_id], rankings[agent.agent_id]):
            if len(chosen) >= need:
                break
            if box_id not in chosen and fill.fits(agent, box_id):
                fill.take(agent, box_id)
    return unplaced


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
        fill = Fill(spec, config, demand.dedicated)
        single = single_pass(demand, index, fill, trace)
        if not single:
            if trace is not None:
                trace.clear()
            fill = Fill(spec, config, demand.dedicated)
            unplaced = coverage_first(demand, index, fill)
        groups = fill.groups()
    placement = Placement(groups=groups, wanted=demand.wanted, unplaced=unplaced, dedicated=demand.dedicated)
    return placement, single
