"""Each agent's rendezvous ranking of its model's boxes, in two levels, computed once and kept.

Why two levels ("skeleton" HRW): a flat ranking costs one hash per (agent, box) — 10^8 for 20,000 agents on
5,000 boxes. Instead every box falls into one of a fixed number of hash buckets (by its own id, so the
bucket never changes), the agent ranks the buckets, then ranks boxes inside a bucket only when it gets
there. Each agent's ranking is still one fixed total order over all possible box ids (bucket rank, then box
rank), so the stability guarantees of flat HRW hold exactly; the price is a slight load skew between boxes
in small and large buckets, which the per-box caps absorb by spilling.

Why kept: an agent's order inside a bucket depends only on the agent and that bucket's members, so it stays
valid until a box joins or leaves that bucket — then only the agents that had looked into it recompute.
Re-placing after a change (and incremental placement) therefore pays the fill, not the hashing.

Why batched: one agent at a time, a cold placement of 20,000 agents is mostly this hashing; `prime` ranks
all of them at once in numpy arrays (about five times cheaper), and `walk` ranks lazily what `prime` did not.
Both give the same keys (`hashing`).
"""

from __future__ import annotations

import bisect
import functools
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field

from warmer.core.placement.hashing import (
    INDEX_MASK,
    Lanes,
    best_members,
    ranked_member_rows,
    seed_array,
    sort_key,
    stable_seed,
)


@dataclass(slots=True)
class _Ranking:
    """One agent's ranking as far as it has been needed: its best bucket, then every bucket's order."""

    model: str
    seed: int
    first: int
    order: list[int] | None = None  # every bucket, best first, once a walk goes past the first
    members: dict[int, list[str]] = field(default_factory=dict)  # bucket -> its box ids, best first


@dataclass(slots=True)
class _Bucket:
    ids: list[str] = field(default_factory=list)  # in the order the boxes were given (ties break by it)
    seeds: list[int] = field(default_factory=list)
    orders: list[int] = field(default_factory=list)  # each member's place in that order
    lanes: Lanes | None = None  # built when first needed after a change
    number: int = 0
    ranked_by: set[str] = field(default_factory=set)  # agents holding this bucket's order in their cache


class BoxIndex:
    """The eligible boxes of every model, bucketed by their own id, and the agents' rankings of them."""

    def __init__(self, buckets: int, *, keep: bool = True) -> None:
        """`keep`: hold the rankings `walk` computes for later calls (a one-off placement does not; what
        `prime` computed is held either way, for the walks that follow it)."""
        self._keep = keep
        self._bucket_seeds = [stable_seed("bucket", str(i)) for i in range(buckets)]
        self._bucket_array = seed_array(self._bucket_seeds)
        self._bucket_lanes = Lanes(self._bucket_seeds)
        self._models: dict[str, list[_Bucket]] = {}
        self._sizes: dict[str, int] = {}
        self._where: dict[str, tuple[str, int]] = {}  # box id -> (model, bucket)
        self._box_seeds: dict[str, int] = {}
        self._rankings: dict[str, _Ranking] = {}
        self._next_order = 0

    def __contains__(self, box_id: object) -> bool:
        return box_id in self._where

    def serves(self, model: str) -> bool:
        """Whether any box of the model is in the index."""
        return self._sizes.get(model, 0) > 0

    def bucket_of(self, box_id: str) -> tuple[str, int]:
        return self._where[box_id]

    def add(self, box_id: str, model: str, order: int | None = None) -> int:
        """Index a box; `order` is its place among all boxes given (default: after every box indexed so
        far), so a box that comes back joins its bucket where a fresh index would have put it. Returns
        its bucket."""
        if box_id in self._where:
            raise ValueError(f"boxes: duplicate box id {box_id!r}")
        buckets = self._models.get(model)
        if buckets is None:
            buckets = self._models[model] = [_Bucket(number=i) for i in range(len(self._bucket_seeds))]
        number = stable_seed("box-bucket", box_id) % len(self._bucket_seeds)
        seed = stable_seed("box", box_id)
        bucket = buckets[number]
        if order is None:
            order = self._next_order
        self._next_order = max(self._next_order, order + 1)
        at = bisect.bisect(bucket.orders, order)
        bucket.ids.insert(at, box_id)
        bucket.seeds.insert(at, seed)
        bucket.orders.insert(at, order)
        self._invalidate(bucket)
        self._where[box_id] = (model, number)
        self._box_seeds[box_id] = seed
        self._sizes[model] = self._sizes.get(model, 0) + 1
        return number

    def remove(self, box_id: str) -> tuple[str, int]:
        """Take a box out; returns the (model, bucket) it was in."""
        model, number = self._where.pop(box_id)
        bucket = self._models[model][number]
        position = bucket.ids.index(box_id)
        del bucket.ids[position]
        del bucket.seeds[position]
        del bucket.orders[position]
        self._invalidate(bucket)
        del self._box_seeds[box_id]
        self._sizes[model] -= 1
        return model, number

    def _invalidate(self, bucket: _Bucket) -> None:
        bucket.lanes = None
        for agent_id in bucket.ranked_by:
            ranking = self._rankings.get(agent_id)
            if ranking is not None:
                ranking.members.pop(bucket.number, None)  # its members changed
        bucket.ranked_by.clear()

    def forget(self, agent_id: str) -> None:
        """Drop an agent's cached ranking (it left, or its model changed)."""
        self._rankings.pop(agent_id, None)

    def _ranking(self, agent_id: str, seed: int, model: str) -> _Ranking:
        ranking = self._rankings.get(agent_id)
        if ranking is None or ranking.model != model or ranking.seed != seed:
            ranking = _Ranking(model, seed, self._bucket_lanes.best(seed))
            if self._keep:
                self._rankings[agent_id] = ranking
        return ranking

    def prime(self, agents: Iterable[tuple[str, int, str]]) -> None:
        """Rank many agents (id, seed, model) at once: each one's best bucket and its order of that bucket's
        members, where not held already. Changes no result, only what the walks that follow cost."""
        sizes, rankings = self._sizes, self._rankings
        fresh: list[tuple[str, int, str]] = []
        pending: dict[tuple[str, int], list[tuple[str, _Ranking]]] = defaultdict(list)
        for agent in agents:
            agent_id, seed, model = agent
            if not sizes.get(model):
                continue
            ranking = rankings.get(agent_id)
            if ranking is None or ranking.model != model or ranking.seed != seed:
                fresh.append(agent)
            elif ranking.first not in ranking.members:
                pending[model, ranking.first].append((agent_id, ranking))
        if fresh:
            firsts = best_members(seed_array([seed for _, seed, _ in fresh]), self._bucket_array)
            for (agent_id, seed, model), first in zip(fresh, firsts, strict=True):
                ranking = rankings[agent_id] = _Ranking(model, seed, first)
                pending[model, first].append((agent_id, ranking))
        for (model, number), waiting in pending.items():
            bucket = self._models[model][number]
            if not bucket.ids:
                continue
            agent_seeds = seed_array([ranking.seed for _, ranking in waiting])
            rows = ranked_member_rows(agent_seeds, seed_array(bucket.seeds), bucket.ids)
            for (_, ranking), row in zip(waiting, rows, strict=True):
                ranking.members[number] = row
            bucket.ranked_by.update(agent_id for agent_id, _ in waiting)

    def walk(
        self,
        agent_id: str,
        seed: int,
        model: str,
        entered: list[int] | None = None,
        *,
        after_first: bool = False,
    ) -> Iterator[str]:
        """The agent's boxes of its model from most to least preferred, one bucket at a time (`after_first`:
        from its second bucket on, where `first` gave the first).

        `entered` collects every bucket the walk went into, empty ones included: a box joining one of them
        is one the agent would have looked at.
        """
        ranking = self._ranking(agent_id, seed, model)
        buckets = self._models.get(model)
        if buckets is None:
            return
        order = self._bucket_order(ranking)
        if after_first:
            next(order)
        for number in order:
            if entered is not None:
                entered.append(number)
            bucket = buckets[number]
            ids = bucket.ids
            if not ids:
                continue
            yield from self._members(agent_id, ranking, bucket)

    def first(self, agent_id: str, seed: int, model: str) -> tuple[int, list[str]]:
        """The agent's best bucket of its model (which has boxes) and its order of that bucket's boxes, best
        first: the start of its `walk`, as a list to scan without a generator."""
        ranking = self._rankings.get(agent_id)
        if ranking is not None and ranking.seed == seed and ranking.model == model:
            ranked = ranking.members.get(ranking.first)
            if ranked is not None:
                return ranking.first, ranked  # primed: the case of nearly every agent
        ranking = self._ranking(agent_id, seed, model)
        bucket = self._models[model][ranking.first]
        return ranking.first, self._members(agent_id, ranking, bucket) if bucket.ids else []

    def head(
        self,
        agent_id: str,
        seed: int,
        model: str,
        count: int,
        skip: Collection[str] = (),
        entered: list[int] | None = None,
    ) -> list[str] | None:
        """The first `count` boxes of the agent's walk without `skip`, when its best bucket holds them (at
        fleet scale, nearly every agent's whole walk; then `entered` gets that bucket); None when the walk
        would go on into other buckets."""
        buckets = self._models.get(model)
        if buckets is None:
            return None
        ranking = self._ranking(agent_id, seed, model)
        bucket = buckets[ranking.first]
        ids = bucket.ids
        if len(ids) < count:
            return None
        ranked = self._members(agent_id, ranking, bucket)
        if skip:
            head = [box_id for box_id in ranked if box_id not in skip]
            if len(head) < count:
                return None
            del head[count:]
        else:
            head = ranked[:count]
        if entered is not None:
            entered.append(ranking.first)
        return head

    def _members(self, agent_id: str, ranking: _Ranking, bucket: _Bucket) -> list[str]:
        """The agent's order of a non-empty bucket's boxes, best first (kept when the index keeps)."""
        ranked = ranking.members.get(bucket.number)
        if ranked is None:
            if bucket.lanes is None:
                bucket.lanes = Lanes(bucket.seeds)
            ids = bucket.ids
            ranked = [ids[key & INDEX_MASK] for key in bucket.lanes.ranked_keys(ranking.seed)]
            if self._keep:
                ranking.members[bucket.number] = ranked
                bucket.ranked_by.add(agent_id)
        return ranked

    def _bucket_order(self, ranking: _Ranking) -> Iterator[int]:
        """The agent's buckets, best first; the full order is computed only when a walk goes past the
        first one (most agents never do)."""
        yield ranking.first
        if ranking.order is None:
            ranking.order = [key & INDEX_MASK for key in self._bucket_lanes.ranked_keys(ranking.seed)]
        yield from ranking.order[1:]

    def ranks_before(self, seed: int, box_id: str, other_id: str) -> bool:
        """Whether an agent with this seed ranks `box_id` before `other_id` (both indexed, same model)."""
        model, number = self._where[box_id]
        _, other_number = self._where[other_id]
        if number != other_number:
            mine = sort_key(seed, self._bucket_seeds[number], number)
            theirs = sort_key(seed, self._bucket_seeds[other_number], other_number)
            return mine > theirs
        ids = self._models[model][number].ids
        mine = sort_key(seed, self._box_seeds[box_id], ids.index(box_id))
        theirs = sort_key(seed, self._box_seeds[other_id], ids.index(other_id))
        return mine > theirs


def rendezvous_order(agent_id: str, box_ids: Iterable[str], buckets: int) -> list[str]:
    """These boxes in the agent's ranking order (`BoxIndex.walk`'s, whatever else is indexed): bucket rank,
    then rank inside the bucket. A pure function of the ids, so every process orders them alike; used to
    order an agent's incumbent boxes taken from shared facts (ties of 64-bit scores break by id)."""
    seed = stable_seed("agent", agent_id)

    def key(box_id: str) -> tuple[int, int, str]:
        number, bucket_seed, box_seed = _box_seeds(box_id, buckets)
        return -sort_key(seed, bucket_seed, number), -sort_key(seed, box_seed, 0), box_id

    return sorted(box_ids, key=key)


@functools.lru_cache(maxsize=1 << 16)
def _box_seeds(box_id: str, buckets: int) -> tuple[int, int, int]:
    """A box's bucket, that bucket's seed and its own seed (as `BoxIndex.add` computes them), kept: an
    order of a few boxes then costs no hashing of boxes already seen."""
    number = stable_seed("box-bucket", box_id) % buckets
    return number, stable_seed("bucket", str(number)), stable_seed("box", box_id)
