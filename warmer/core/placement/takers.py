"""What one box held at every turn of the single pass, for the incremental state's checks.

Why: after an edit, a re-run agent asks each box it looks at whether it would have taken the agent at its
turn, which depends on the takers before that turn only. On a capped fleet a re-run agent looks at ~30 full
boxes, each with ~10 takers: counting them again at every look cost most of a box removal (53 ms). Kept
per box until its takers change, the answer is one bisection.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Mapping, Sequence

from warmer.core.model import BoxSpec
from warmer.core.placement.demand import Position
from warmer.core.placement.types import AgentDemand


class BoxHistory:
    """A box's takers in turn order and, after each one, the distinct prefixes it held and their tokens."""

    __slots__ = ("distinct", "exclusive_from", "first", "positions", "tokens")

    def __init__(
        self,
        takers: Sequence[tuple[Position, str]],
        agents: Mapping[str, AgentDemand],
        dedicated: Collection[str],
    ) -> None:
        self.positions = [taken_at for taken_at, _ in takers]
        self.first: dict[str, int] = {}  # prefix -> how many takers came before the first that brought it
        self.tokens = [0]  # [i]: the distinct prefixes' tokens after i takers
        self.distinct = [0]  # [i]: the distinct prefixes after i takers
        self.exclusive_from = len(takers) + 1  # takers up to a dedicated one, which holds it alone from then
        for i, (_, taker_id) in enumerate(takers):
            taker = agents[taker_id]
            key, tokens, distinct = taker.prefix_key, self.tokens[-1], self.distinct[-1]
            if key not in self.first:
                self.first[key] = i
                tokens, distinct = tokens + taker.prefix_tokens, distinct + 1
            self.tokens.append(tokens)
            self.distinct.append(distinct)
            if taker_id in dedicated and self.exclusive_from > i + 1:
                self.exclusive_from = i + 1

    def fits(self, agent: AgentDemand, dedicated: bool, box: BoxSpec, pos: Position, cap: int) -> bool:
        """Whether the box took the agent at turn `pos` (an agent that does not have it yet)."""
        count = bisect.bisect_left(self.positions, pos)  # the takers before this turn
        if count >= self.exclusive_from or count >= cap or (dedicated and count):
            return False
        if self.first.get(agent.prefix_key, count) < count:
            return True  # the prefix is held here already: another agent sharing it costs no cache
        if box.prefix_capacity is not None and self.distinct[count] >= box.prefix_capacity:
            return False
        capacity = box.cache_capacity_tokens
        return capacity is None or self.tokens[count] + agent.prefix_tokens <= capacity
