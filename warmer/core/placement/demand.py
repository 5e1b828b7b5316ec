"""The agents of one placement, checked and in turn order, and what one agent did in the single pass.

Shared by the two single passes (`counted`, by agent counts alone, and `greedy`'s, which checks every cap at
every take), the coverage-first fill and the incremental state.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from warmer.core.model import BoxSpec
from warmer.core.placement.hashing import stable_seeds
from warmer.core.placement.ranking import BoxIndex
from warmer.core.placement.types import AgentDemand, PlacementConfig, UnplacedReason

Position = tuple[bool, int, float, int, str]  # an agent's turn: dedicated first, then busiest, then a hash


def position(agent: AgentDemand, config: PlacementConfig, seed: int) -> Position:
    """Busy agents choose first (dedicated ones before all); ties break by a stable hash, not by id, so no
    agent is always last (the id only separates a 64-bit hash collision)."""
    return (
        not config.is_dedicated(agent),
        -config.wanted_group_size(agent),
        -agent.calls_per_minute,
        seed,
        agent.agent_id,
    )


@dataclass(slots=True)
class Step:
    """What one agent did in the single pass: the boxes it looked at in order, and the ones it took."""

    examined: list[str] = field(default_factory=list)
    chosen: list[str] = field(default_factory=list)
    entered: list[int] = field(default_factory=list)  # hash buckets its ranking walk went into
    complete: bool = False  # it got its whole group (so it stopped looking)


@dataclass(slots=True)
class Demand:
    """The agents of one placement, checked, in turn order, with what each wants and already has."""

    ordered: list[AgentDemand]
    seeds: dict[str, int]
    positions: dict[str, Position]
    wanted: dict[str, int]
    dedicated: frozenset[str]
    incumbents: dict[str, list[str]]  # placeable agents only (their model has boxes)
    unplaced: dict[str, UnplacedReason]

    def ranking(self, index: BoxIndex, agent: AgentDemand, entered: list[int] | None = None) -> Iterator[str]:
        """The agent's ranking without the boxes it has now (those are tried first, separately)."""
        aid = agent.agent_id
        walk = index.walk(aid, self.seeds[aid], agent.model, entered)
        mine = self.incumbents[aid]
        return (box_id for box_id in walk if box_id not in mine) if mine else walk


def check_agents(agents: Sequence[AgentDemand]) -> None:
    """Duplicate ids and one prefix hash with two sizes are input errors, named by field."""
    seen: set[str] = set()
    shared_tokens: dict[str, int] = {}
    for agent in agents:
        if agent.agent_id in seen:
            raise ValueError(f"agents: duplicate agent id {agent.agent_id!r}")
        seen.add(agent.agent_id)
        if agent.prefix_hash:
            known = shared_tokens.setdefault(agent.prefix_hash, agent.prefix_tokens)
            if known != agent.prefix_tokens:
                raise ValueError(
                    f"agents[{agent.agent_id!r}].prefix_tokens: {agent.prefix_tokens} differs from {known} "
                    f"for the same prefix_hash {agent.prefix_hash!r}"
                )


def incumbents_of(
    agent: AgentDemand,
    previous: Mapping[str, Sequence[str]] | None,
    spec: Mapping[str, BoxSpec],
    index: BoxIndex,
) -> list[str]:
    """The boxes serving the agent now that may keep serving it: known, of its model, eligible."""
    return [
        box_id
        for box_id in (previous or {}).get(agent.agent_id, ())
        if box_id in index and spec[box_id].model == agent.model
    ]


def prepare(
    agents: Sequence[AgentDemand],
    config: PlacementConfig,
    spec: Mapping[str, BoxSpec],
    index: BoxIndex,
    previous: Mapping[str, Sequence[str]] | None,
    seeds: Mapping[str, int] | None = None,
) -> Demand:
    check_agents(agents)
    known = seeds or {}
    unseeded = [a.agent_id for a in agents if not known.get(a.agent_id)]
    seed_of = {a.agent_id: known[a.agent_id] for a in agents if known.get(a.agent_id)}
    seed_of.update(zip(unseeded, stable_seeds("agent", unseeded), strict=True))
    wanted = {a.agent_id: config.wanted_group_size(a) for a in agents}
    dedicated = frozenset(a.agent_id for a in agents if config.is_dedicated(a))
    positions: dict[str, Position] = {
        a.agent_id: (
            a.agent_id not in dedicated,
            -wanted[a.agent_id],
            -a.calls_per_minute,
            seed_of[a.agent_id],
            a.agent_id,
        )
        for a in agents
    }  # `position`, with what is known already
    ordered = sorted(agents, key=lambda a: positions[a.agent_id])
    unplaced: dict[str, UnplacedReason] = {}
    incumbents: dict[str, list[str]] = {}
    for agent in ordered:
        if not index.serves(agent.model):
            unplaced[agent.agent_id] = UnplacedReason.NO_BOXES
        elif previous and agent.agent_id in previous:
            incumbents[agent.agent_id] = incumbents_of(agent, previous, spec, index)
        else:
            incumbents[agent.agent_id] = []
    return Demand(
        ordered=ordered,
        seeds=seed_of,
        positions=positions,
        wanted=wanted,
        dedicated=dedicated,
        incumbents=incumbents,
        unplaced=unplaced,
    )
