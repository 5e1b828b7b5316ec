"""The placement algorithm as it was before the ranking cache and incremental placement: the baseline
`bench.plan_scale` measures the current `warmer.core.placement.place` against (and checks it gives the same
groups). Kept verbatim, apart from importing the public input types from the current module.
"""

from __future__ import annotations

import array
import heapq
from collections.abc import Collection, Iterator, Mapping, Sequence

from warmer.core.model import BoxSpec
from warmer.core.placement import AgentDemand, Placement, PlacementConfig, UnplacedReason, stable_seed

_MASK64 = (1 << 64) - 1
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


_LANE_BITS = 128  # a 64-bit score times a 64-bit constant fits in one lane without carrying into the next
_INDEX_BITS = 20  # low bits of a sort key hold the member index (a bucket holds < 2**20 boxes)


class _Lanes:
    """Scores of one agent against many seeds at once, SIMD-style inside one Python big int.

    Every seed sits in its own 128-bit lane; XOR, shifts (masked back to 64 bits per lane) and the
    SplitMix64 multiplies then run over all lanes in a handful of big-int operations instead of a Python
    loop per box — about 5x faster, and exactly `mix64(agent_seed ^ seed)` per lane.
    """

    __slots__ = ("_count", "_index", "_key_mask", "_low", "_packed", "_replicate")

    def __init__(self, seeds: Sequence[int]) -> None:
        if len(seeds) >= 1 << _INDEX_BITS:
            raise ValueError(f"too many boxes in one hash bucket: {len(seeds)}")
        self._count = len(seeds)
        self._replicate = sum(1 << (_LANE_BITS * i) for i in range(len(seeds)))
        self._low = _MASK64 * self._replicate
        self._key_mask = (_MASK64 ^ ((1 << _INDEX_BITS) - 1)) * self._replicate
        self._packed = sum(seed << (_LANE_BITS * i) for i, seed in enumerate(seeds))
        self._index = sum(i << (_LANE_BITS * i) for i in range(len(seeds)))

    def ranked(self, agent_seed: int, first: int = 1) -> Iterator[int]:
        """Member indices from highest to lowest score (ties, 2**-44 likely, break by index).

        Placement usually needs only the top few, so the best `first` come from a partial selection and
        the full sort happens only if the caller keeps going.
        """
        if not self._count:
            return
        low = self._low
        x = self._packed ^ (agent_seed * self._replicate)
        x = (((x ^ (x >> 30)) & low) * _MIX1) & low
        x = (((x ^ (x >> 27)) & low) * _MIX2) & low
        x = (x ^ (x >> 31)) & low
        keys = (x & self._key_mask) | self._index
        lanes = array.array("Q")
        lanes.frombytes(keys.to_bytes(self._count * (_LANE_BITS // 8), "little"))
        scores = lanes[::2]
        index_mask = (1 << _INDEX_BITS) - 1
        top = heapq.nlargest(first, scores) if first < self._count else sorted(scores, reverse=True)
        for key in top:
            yield key & index_mask
        if len(top) < self._count:
            for key in sorted(scores, reverse=True)[len(top) :]:
                yield key & index_mask


class _ModelBoxes:
    """The eligible boxes of one model, bucketed by their own id."""

    def __init__(self, bucket_seeds: list[int]) -> None:
        self.member_seeds: list[list[int]] = [[] for _ in bucket_seeds]
        self.member_ids: list[list[str]] = [[] for _ in bucket_seeds]
        self._bucket_seeds = bucket_seeds
        self._bucket_lanes: _Lanes | None = None
        self._member_lanes: list[_Lanes] = []

    def add(self, bucket: int, box_seed: int, box_id: str) -> None:
        self.member_seeds[bucket].append(box_seed)
        self.member_ids[bucket].append(box_id)

    def ranking(self, agent_seed: int, first: int) -> Iterator[str]:
        """The agent's boxes from most to least preferred, computed lazily one bucket at a time.

        `first` is a hint of how many boxes the caller expects to take (it only affects speed).
        """
        if self._bucket_lanes is None:
            self._bucket_lanes = _Lanes(self._bucket_seeds)
            self._member_lanes = [_Lanes(seeds) for seeds in self.member_seeds]
        for bucket in self._bucket_lanes.ranked(agent_seed, 2):
            ids = self.member_ids[bucket]
            if not ids:
                continue
            for index in self._member_lanes[bucket].ranked(agent_seed, first):
                yield ids[index]


def _index_boxes(
    boxes: Sequence[BoxSpec], eligible: Collection[str] | None, buckets: int
) -> tuple[dict[str, _ModelBoxes], dict[str, BoxSpec]]:
    seen: dict[str, BoxSpec] = {}
    for box in boxes:
        if box.id in seen:
            raise ValueError(f"boxes: duplicate box id {box.id!r}")
        seen[box.id] = box
    allowed = set(eligible) if eligible is not None else None
    bucket_seeds = [stable_seed("bucket", str(i)) for i in range(buckets)]
    by_model: dict[str, _ModelBoxes] = {}
    for box in boxes:
        if allowed is not None and box.id not in allowed:
            continue
        model = by_model.get(box.model)
        if model is None:
            model = by_model[box.model] = _ModelBoxes(bucket_seeds)
        model.add(stable_seed("box-bucket", box.id) % buckets, stable_seed("box", box.id), box.id)
    return by_model, seen


class _Fill:
    """What a placement in progress has given each box: agents, distinct prefixes and their tokens."""

    def __init__(self, spec: Mapping[str, BoxSpec], config: PlacementConfig, dedicated: frozenset[str]):
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
        if holds is not None and (agent.prefix_hash or f"agent:{agent.agent_id}") in holds:
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
        prefix_key = agent.prefix_hash or f"agent:{agent.agent_id}"
        if prefix_key not in holds:
            holds.add(prefix_key)
            self._tokens[box_id] = self._tokens.get(box_id, 0) + agent.prefix_tokens
        if agent.agent_id in self._dedicated:
            self._exclusive.add(box_id)
        return len(chosen)

    def groups(self) -> dict[str, tuple[str, ...]]:
        return {agent_id: tuple(chosen) for agent_id, chosen in self.chosen.items() if chosen}


def baseline_place(
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

    Busy agents choose first (dedicated ones before all), so under pressure the quiet ones spill or go
    unplaced; ties break by a stable hash, not by id, so no agent is always last.
    """
    config = config or PlacementConfig()
    by_model, spec = _index_boxes(boxes, eligible, config.hash_buckets)
    allowed = set(eligible) if eligible is not None else None
    seeds: dict[str, int] = {}
    shared_tokens: dict[str, int] = {}
    for agent in agents:
        if agent.agent_id in seeds:
            raise ValueError(f"agents: duplicate agent id {agent.agent_id!r}")
        seeds[agent.agent_id] = stable_seed("agent", agent.agent_id)
        if agent.prefix_hash:
            known = shared_tokens.setdefault(agent.prefix_hash, agent.prefix_tokens)
            if known != agent.prefix_tokens:
                raise ValueError(
                    f"agents[{agent.agent_id!r}].prefix_tokens: {agent.prefix_tokens} differs from {known} "
                    f"for the same prefix_hash {agent.prefix_hash!r}"
                )
    wanted = {agent.agent_id: config.wanted_group_size(agent) for agent in agents}
    dedicated = frozenset(agent.agent_id for agent in agents if config.is_dedicated(agent))

    def priority(agent: AgentDemand) -> tuple[bool, int, float, int]:
        return (
            agent.agent_id not in dedicated,
            -wanted[agent.agent_id],
            -agent.calls_per_minute,
            seeds[agent.agent_id],
        )

    ordered = sorted(agents, key=priority)
    unplaced: dict[str, UnplacedReason] = {}
    incumbents: dict[str, list[str]] = {}
    for agent in ordered:
        if agent.model not in by_model:
            unplaced[agent.agent_id] = UnplacedReason.NO_BOXES
            continue
        incumbents[agent.agent_id] = [
            box_id
            for box_id in (previous or {}).get(agent.agent_id, ())
            if box_id in spec and spec[box_id].model == agent.model and (allowed is None or box_id in allowed)
        ]

    def ranking(agent: AgentDemand) -> Iterator[str]:
        """The agent's ranking without the boxes it has now (those are tried first, separately)."""
        return _excluding(
            incumbents[agent.agent_id],
            by_model[agent.model].ranking(seeds[agent.agent_id], wanted[agent.agent_id]),
        )

    placeable = [agent for agent in ordered if agent.agent_id in incumbents]
    # Where every agent fits with its whole group (caps do not bind: the usual case at fleet scale), one
    # pass in priority order is the answer, each agent's boxes it has first.
    fill = _Fill(spec, config, dedicated)
    for agent in placeable:
        need = wanted[agent.agent_id]
        for box_id in _chain(incumbents[agent.agent_id], ranking(agent)):
            if fill.fits(agent, box_id) and fill.take(agent, box_id) == need:
                break
        if not fill.chosen.get(agent.agent_id):
            break
    else:
        return Placement(groups=fill.groups(), wanted=wanted, unplaced=unplaced, dedicated=dedicated)

    # Caps bind: coverage first. Every agent gets one box before any agent gets its spill room, so a fleet
    # short of cache serves every agent warm somewhere instead of a few agents twice and the rest nowhere.
    # An agent that has boxes keeps one if it still fits; one pushed out of its boxes by a busier agent
    # waits until every agent has kept what it could, so displacement does not cascade through the fleet.
    fill = _Fill(spec, config, dedicated)
    rankings = {agent.agent_id: ranking(agent) for agent in placeable}

    def cover(agent: AgentDemand, candidates: Iterator[str] | list[str]) -> None:
        first_pass = wanted[agent.agent_id] if agent.agent_id in dedicated else 1  # dedicated take all
        for box_id in candidates:
            if fill.fits(agent, box_id) and fill.take(agent, box_id) >= first_pass:
                return

    pushed_out: list[AgentDemand] = []
    for agent in placeable:
        if incumbents[agent.agent_id]:
            cover(agent, incumbents[agent.agent_id])
            if agent.agent_id not in fill.chosen:
                pushed_out.append(agent)
        else:
            cover(agent, rankings[agent.agent_id])
    for agent in pushed_out:
        cover(agent, rankings[agent.agent_id])
    # Then spill room, busiest first: the rest of the agent's boxes, then further down its ranking (boxes
    # skipped above were full then and are fuller now, so the ranking continues where it stopped).
    for agent in placeable:
        chosen = fill.chosen.get(agent.agent_id)
        if not chosen:
            unplaced[agent.agent_id] = UnplacedReason.CAPACITY
            continue
        need = wanted[agent.agent_id]
        for box_id in _chain(incumbents[agent.agent_id], rankings[agent.agent_id]):
            if len(chosen) >= need:
                break
            if box_id not in chosen and fill.fits(agent, box_id):
                fill.take(agent, box_id)
    return Placement(groups=fill.groups(), wanted=wanted, unplaced=unplaced, dedicated=dedicated)


def _excluding(incumbents: Sequence[str], ranking: Iterator[str]) -> Iterator[str]:
    """The agent's ranking without the boxes it has now (those are tried first, separately)."""
    seen = set(incumbents)
    for box_id in ranking:
        if box_id not in seen:
            yield box_id


def _chain(first: Sequence[str], rest: Iterator[str]) -> Iterator[str]:
    yield from first
    yield from rest
