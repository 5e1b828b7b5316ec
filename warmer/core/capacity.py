"""Capacity for pacing: per agent group, the uncached prefill budget left, in tokens per second.

What fills a box is prefill, not slots: every uncached prompt token is computed at a roughly fixed rate
(the box's prefill ceiling), and latency breaks well before that rate is reached. Field measurements
(seed 000) put the break at about 60% of the ceiling, whatever mix of cached and uncached calls produced
it, so the budget a box can spend is `ceiling x safe_fraction` uncached tokens per second, and the
headroom is that budget minus what its engine is computing now.

Inputs are figures the engines report themselves:
* the ceiling: a profile's `prefill_tokens_per_second` when set, else measured on the box from the
  restart warm-up's long prefill (computed prompt tokens / engine prompt seconds of that one request);
* the use: uncached prompt tokens per second between two scrapes of the engine's cumulative counters
  (`CacheStats`: queried - hit, the hit-rate monitor's scrapes).

Per agent, the headroom of each box it is routed to is summed. A box routed for several agents is
counted for each of them: the figure says what the agent could take if the others stay where they are.
Pure: no clock, no I/O; the service layer hands in what it read.

The second half is the **prefix budget** of a box whose cache is one shared token pool (vLLM blocks, SGLang's
token pool): how many prefix tokens may be kept warm beside the live calls. Live calls come first: their
working set (the used share of the pool) grows with load, so the budget is the pool less that working set
with headroom for growth until the next reading, less a floor kept free. It follows load through a band
(`PrefixBudgetPolicy.in_force`), so a budget that moves a little at every reading does not re-run
placement every time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from warmer.core import model
from warmer.core.model import CacheStats

DEFAULT_SAFE_FRACTION = 0.6
CeilingSource = Literal["profile", "measured", "warmup_phase"]


@dataclass(frozen=True, slots=True)
class PrefillCeiling:
    """Uncached prompt tokens per second one box computes at full load, and where the figure came from.

    `measured`: exact computed tokens / engine prompt seconds of the long prefill; `warmup_phase`: the
    long-prefill phase as recorded in the store (its target token count over its engine seconds), used
    when this daemon did not see the request itself (an earlier daemon ran the warm-up).
    """

    tokens_per_second: float
    source: CeilingSource


@dataclass(frozen=True, slots=True)
class UncachedRate:
    """Uncached prompt tokens per second a box computed over one window between two counter scrapes."""

    tokens_per_second: float
    window_seconds: float
    at: float  # monotonic seconds of the scrape that closed the window


def ceiling_from_prefill(
    prompt_tokens: int, cached_tokens: int, prompt_seconds: float | None
) -> float | None:
    """Computed tokens per engine second of one long prefill; None when it says nothing (no timing, or
    too little was computed to time)."""
    computed = prompt_tokens - cached_tokens
    if prompt_seconds is None or prompt_seconds <= 0 or computed <= 0:
        return None
    return computed / prompt_seconds


def uncached_rate_between(
    before: CacheStats, before_at: float, after: CacheStats, after_at: float
) -> UncachedRate | None:
    """Uncached tokens/s between two cumulative scrapes; None when the counters are missing, went down
    (the engine restarted), or no time passed."""
    elapsed = after_at - before_at
    if elapsed <= 0:
        return None
    q0, h0, q1, h1 = before.queried_tokens, before.hit_tokens, after.queried_tokens, after.hit_tokens
    if q0 is None or h0 is None or q1 is None or h1 is None or q1 < q0 or h1 < h0:
        return None
    uncached = (q1 - h1) - (q0 - h0)
    return UncachedRate(max(0.0, uncached) / elapsed, elapsed, after_at)


@dataclass(frozen=True, slots=True)
class BoxCapacity:
    """One box's prefill budget: ceiling, the safe share of it, what is used now, what is left."""

    box_id: str
    ceiling_tokens_per_second: float | None
    ceiling_source: CeilingSource | None
    budget_tokens_per_second: float | None  # ceiling x safe fraction
    used_tokens_per_second: float | None  # uncached, over the last counter window
    headroom_tokens_per_second: float | None  # budget - used; negative: over budget (latency breaks)
    utilization: float | None  # used / ceiling
    reason: str | None = None  # why a figure is missing


def box_capacity(
    box_id: str,
    ceiling: PrefillCeiling | None,
    used: UncachedRate | None,
    *,
    safe_fraction: float = DEFAULT_SAFE_FRACTION,
) -> BoxCapacity:
    if not 0.0 < safe_fraction <= 1.0:
        raise ValueError("safe_fraction must be within (0, 1]")
    budget = None if ceiling is None else ceiling.tokens_per_second * safe_fraction
    used_tps = None if used is None else used.tokens_per_second
    reasons = []
    if ceiling is None:
        reasons.append(
            "no prefill ceiling: no long-prefill measurement and no profile prefill_tokens_per_second"
        )
    if used is None:
        reasons.append("no uncached-token window from the engine's counters yet")
    return BoxCapacity(
        box_id=box_id,
        ceiling_tokens_per_second=None if ceiling is None else ceiling.tokens_per_second,
        ceiling_source=None if ceiling is None else ceiling.source,
        budget_tokens_per_second=budget,
        used_tokens_per_second=used_tps,
        headroom_tokens_per_second=None if budget is None or used_tps is None else budget - used_tps,
        utilization=None if ceiling is None or used_tps is None else used_tps / ceiling.tokens_per_second,
        reason="; ".join(reasons) or None,
    )


@dataclass(frozen=True, slots=True)
class AgentCapacity:
    """An agent group's prefill budget: the sums over the boxes it is routed to that have both figures.

    `calls_per_minute` is how many more turn-1 prefills per minute the headroom carries on a warm box
    (headroom / the uncached part of a turn-1 prompt): an upper bound for new calls, since a call's later
    turns spend budget too (those of live calls are in `used` already).
    """

    agent_id: str
    boxes: tuple[str, ...]  # routed boxes, in spill order
    measured_boxes: tuple[str, ...]  # of those, the ones whose ceiling and use are both known
    ceiling_tokens_per_second: float | None
    budget_tokens_per_second: float | None
    used_tokens_per_second: float | None
    headroom_tokens_per_second: float | None
    uncached_tokens_per_call: int | None
    calls_per_minute: float | None
    shares_boxes_with: tuple[str, ...]  # other agents routed to any of these boxes


def _total(measured: Sequence[BoxCapacity], values: Sequence[float | None]) -> float | None:
    """Sum of the known values; None when no routed box is measured."""
    return sum(v for v in values if v is not None) if measured else None


def agent_capacity(
    routes: Mapping[str, Sequence[str]],
    boxes: Mapping[str, BoxCapacity],
    *,
    uncached_tokens_per_call: Mapping[str, int] | None = None,
) -> list[AgentCapacity]:
    """Per agent (sorted): its routed boxes' budgets summed. An agent with no routed box has none."""
    per_call = uncached_tokens_per_call or {}
    agents_of_box: dict[str, set[str]] = {}
    for agent_id, routed in routes.items():
        for box_id in routed:
            agents_of_box.setdefault(box_id, set()).add(agent_id)
    answer = []
    for agent_id in sorted(routes):
        routed = tuple(dict.fromkeys(routes[agent_id]))
        measured = [
            boxes[b] for b in routed if b in boxes and boxes[b].headroom_tokens_per_second is not None
        ]
        headroom = _total(measured, [b.headroom_tokens_per_second for b in measured])
        call_tokens = per_call.get(agent_id)
        calls = None
        if headroom is not None and call_tokens:
            calls = max(0.0, headroom) * 60.0 / call_tokens
        answer.append(
            AgentCapacity(
                agent_id=agent_id,
                boxes=routed,
                measured_boxes=tuple(b.box_id for b in measured),
                ceiling_tokens_per_second=_total(measured, [b.ceiling_tokens_per_second for b in measured]),
                budget_tokens_per_second=_total(measured, [b.budget_tokens_per_second for b in measured]),
                used_tokens_per_second=_total(measured, [b.used_tokens_per_second for b in measured]),
                headroom_tokens_per_second=headroom,
                uncached_tokens_per_call=call_tokens,
                calls_per_minute=calls,
                shares_boxes_with=tuple(
                    sorted({a for b in routed for a in agents_of_box.get(b, ()) if a != agent_id})
                ),
            )
        )
    return answer


# --- the prefix budget of a shared token pool -------------------------------------------------------------

DEFAULT_PREFIX_HEADROOM = 0.25
DEFAULT_PREFIX_FLOOR = 0.05
DEFAULT_PREFIX_BAND = 0.10


@dataclass(frozen=True, slots=True)
class PrefixBudgetPolicy:
    """How much of a pool is left for prefixes, and how far a new reading must move the budget in force.

    `headroom`: the live working set is counted `(1 + headroom)` times, so calls that arrive before the next
    reading still fit; `floor`: a share of the pool never given to prefixes; `band`: the relative change the
    budget in force ignores (a change of more than `band` of it applies, either way)."""

    headroom: float = DEFAULT_PREFIX_HEADROOM
    floor: float = DEFAULT_PREFIX_FLOOR
    band: float = DEFAULT_PREFIX_BAND

    def __post_init__(self) -> None:
        if not self.headroom >= 0:
            raise ValueError(f"prefix budget headroom must be >= 0, got {self.headroom}")
        if not 0 <= self.floor < 1:
            raise ValueError(f"prefix budget floor must be within [0, 1), got {self.floor}")
        if not 0 <= self.band < 1:
            raise ValueError(f"prefix budget band must be within [0, 1), got {self.band}")

    def budget(self, pool_tokens: int, used_share: float | None) -> int:
        """`prefix_budget_tokens` under this policy."""
        return prefix_budget_tokens(pool_tokens, used_share, headroom=self.headroom, floor=self.floor)

    def in_force(self, current: int | None, new: int) -> int:
        """`budget_in_force` under this policy's band."""
        return budget_in_force(current, new, band=self.band)


def prefix_budget_tokens(
    pool_tokens: int,
    used_share: float | None,
    *,
    headroom: float = DEFAULT_PREFIX_HEADROOM,
    floor: float = DEFAULT_PREFIX_FLOOR,
) -> int:
    """Prefix tokens a pool holds beside its live calls: pool - working set x (1 + headroom) - floor x pool,
    never negative. An unknown used share (the engine's metrics are off) counts as an idle pool: the floor
    alone is kept free, as it was before the load could be read."""
    if pool_tokens <= 0:
        return 0
    share = min(max(used_share or 0.0, 0.0), 1.0)  # a gauge is a ratio; clamp a stray reading
    left = pool_tokens * (1.0 - share * (1.0 + headroom) - floor)
    return max(0, int(left))


def budget_in_force(current: int | None, new: int, *, band: float = DEFAULT_PREFIX_BAND) -> int:
    """The budget to use now: `new` when nothing is in force yet or when it differs from the budget in force
    by more than `band` of it; otherwise the budget in force stays. A shrink past the band applies at the
    first reading that shows it (the room is gone: warming into it only evicts); a growth within the band
    waits, so a budget that moves a little at every reading does not re-place its box each time. Measured
    from the budget in force, not the last reading, so a slow drift applies once it adds up to the band."""
    if current is None:
        return new
    return new if abs(new - current) > band * max(current, 1) else current


def capacity_in_force(
    in_force: model.BoxCapacity | None, read: model.BoxCapacity, policy: PrefixBudgetPolicy
) -> model.BoxCapacity:
    """The figures to place by after a new reading: the reading, with its prefix budget (`tokens`) derived
    from its pool and used share under `policy` and held within the band of the budget in force. Without a
    pool the reading stands as the engine gave it; a different pool (a new process, a resized cache) starts
    the budget afresh."""
    if read.pool_tokens is None:
        return read
    budget = policy.budget(read.pool_tokens, read.used_share)
    current = None
    if in_force is not None and in_force.pool_tokens == read.pool_tokens:
        current = in_force.tokens
    return replace(read, tokens=policy.in_force(current, budget))


@dataclass(frozen=True, slots=True)
class Shortfall:
    """Demand the fleet's caches cannot hold: agents with a prefix and no box keeping it warm.

    A crowded fleet is the normal case; saying so in tokens and agents tells an operator how much cache
    is missing, and which agents' calls start cold unless room is lent to them just in time."""

    agents_wanted: int
    agents_kept: int
    agents_without_room: tuple[str, ...]
    tokens_without_room: int  # prefix tokens those agents would need, one copy each


def shortfall(prefix_tokens: Mapping[str, int], assignment: Mapping[str, Sequence[str]]) -> Shortfall:
    """From the agents' prefix sizes and the keep-warm assignment (loans included)."""
    without = tuple(sorted(agent for agent in prefix_tokens if not assignment.get(agent)))
    return Shortfall(
        agents_wanted=len(prefix_tokens),
        agents_kept=len(prefix_tokens) - len(without),
        agents_without_room=without,
        tokens_without_room=sum(prefix_tokens[agent] for agent in without),
    )
