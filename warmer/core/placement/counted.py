"""The single pass by agent counts alone, where no box's prefix or token cap can bind.

Why it is exact: in the single pass (`capped`) a box is refused by its agent cap, its prefix cap, its token
cap, a dedicated agent, or because the agent has it already. A box whose prefix cap is at least the agent
cap, and whose token cap holds the agent cap times the largest prefix, can refuse by its agent cap only (it
never holds more distinct prefixes than agents). Where every box is like that and no agent is dedicated,
the pass needs one count per box, and most agents just take the head of their ranking: the checks and
bookkeeping of `Fill` at every take were ~40% of a cold placement. Otherwise this gives None and
`capped_pass` decides.
"""

from __future__ import annotations

from collections.abc import Mapping

from warmer.core.model import BoxSpec
from warmer.core.placement.demand import Demand, Step
from warmer.core.placement.ranking import BoxIndex
from warmer.core.placement.types import AgentDemand, PlacementConfig


def counted_pass(
    demand: Demand,
    index: BoxIndex,
    spec: Mapping[str, BoxSpec],
    config: PlacementConfig,
    trace: dict[str, Step] | None = None,
) -> dict[str, tuple[str, ...]] | None:
    """Every placeable agent's group exactly as the single pass gives it, in turn order; None where this pass
    does not apply, or some agent got no box (then coverage comes first). `trace`, when given, receives each
    agent's step (partly filled on None)."""
    cap = config.max_agents_per_box
    if demand.dedicated or not _counts_decide(demand, spec, cap):
        return None
    seeds, wanted, incumbents = demand.seeds, demand.wanted, demand.incumbents
    counts: dict[str, int] = {}
    groups: dict[str, tuple[str, ...]] = {}
    for agent in demand.ordered:
        aid = agent.agent_id
        mine = incumbents.get(aid)
        if mine is None:
            continue  # no box serves its model
        need = wanted[aid]
        entered: list[int] = []
        head: list[str] | None
        if len(mine) > 1 and len(set(mine)) < len(mine):
            head = None  # a repeated box is skipped the second time
        elif len(mine) >= need:
            head = mine[:need]
        else:
            head = index.head(aid, seeds[aid], agent.model, need - len(mine), mine, entered)
            if head is not None and mine:
                head = [*mine, *head]
        if head is not None:
            for box_id in head:
                if counts.get(box_id, 0) >= cap:
                    head = None  # a box of its head is full: it looks further, as the general pass does
                    break
        if head is not None:
            chosen = examined = head  # no box refused it: it took the head of its candidates
        else:
            entered.clear()
            chosen, examined = _walk(demand, index, agent, counts, cap, entered)
            if not chosen:
                return None
        for box_id in chosen:
            counts[box_id] = counts.get(box_id, 0) + 1
        groups[aid] = tuple(chosen)
        if trace is not None:
            trace[aid] = Step(list(examined), list(chosen), entered, len(chosen) == need)
    return groups


def _counts_decide(demand: Demand, spec: Mapping[str, BoxSpec], cap: int) -> bool:
    """Whether no box can refuse an agent but by its agent cap (module docstring)."""
    largest = max((agent.prefix_tokens for agent in demand.ordered), default=0)
    return all(
        (box.prefix_capacity is None or box.prefix_capacity >= cap)
        and (box.cache_capacity_tokens is None or cap * largest <= box.cache_capacity_tokens)
        for box in spec.values()
    )


def _walk(
    demand: Demand,
    index: BoxIndex,
    agent: AgentDemand,
    counts: Mapping[str, int],
    cap: int,
    entered: list[int],
) -> tuple[list[str], list[str]]:
    """The single pass's takes over the agent's boxes, then over its ranking without them, by counts alone:
    (the boxes taken, the boxes looked at)."""
    mine, need = demand.incumbents[agent.agent_id], demand.wanted[agent.agent_id]
    chosen: list[str] = []
    examined: list[str] = []
    for box_id in mine:
        examined.append(box_id)
        if counts.get(box_id, 0) < cap and box_id not in chosen:
            chosen.append(box_id)
            if len(chosen) >= need:
                return chosen, examined
    for box_id in demand.ranking(index, agent, entered):
        examined.append(box_id)
        if counts.get(box_id, 0) < cap:
            chosen.append(box_id)
            if len(chosen) >= need:
                break
    return chosen, examined
