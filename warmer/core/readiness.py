"""What makes a box ready, and where an agent's calls may go: pure answers over the planner's view.

A box is ready only when it is healthy, its current epoch's restart warm-up is done, it is not drained for a
rollout, and every prefix kept warm on it is believed warm in that epoch. An agent is routed only to boxes
of its routing group where its own prefix is believed warm after that warm-up; a box losing either drops
out at once, and a newly warm box takes a small, rising share of traffic (`ramp_weight`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from warmer.core.model import WarmState
from warmer.core.planner import (
    Desired,
    Observed,
    PlannerConfig,
    WantedPrefix,
    WarmupStatus,
    active_agents,
    wanted_by_box,
)
from warmer.core.warmstate import is_serving


@dataclass(frozen=True, slots=True)
class BoxReadiness:
    ready: bool
    reasons: tuple[str, ...]  # why not ready (empty when ready)
    since: float | None  # when the current ready stretch began, when ready


def box_ready(
    box_id: str, desired: Desired, observed: Observed, now: float, config: PlannerConfig
) -> BoxReadiness:
    """Ready: healthy, restart warm-up of this epoch done, every kept-warm prefix here believed warm."""
    return boxes_ready((box_id,), desired, observed, now, config)[box_id]


def boxes_ready(
    box_ids: Iterable[str], desired: Desired, observed: Observed, now: float, config: PlannerConfig
) -> dict[str, BoxReadiness]:
    """`box_ready` of many boxes, with what every box shares (the kept-warm prefixes per box, the routed
    boxes) computed once: a pass or a fleet view asks it for every box, O(agents) once instead of per box."""
    ids = list(box_ids)
    wants: dict[str, dict[str, WantedPrefix]] | None = None
    routed: set[str] | None = None
    answers: dict[str, BoxReadiness] = {}
    for box_id in ids:
        seen = observed.boxes.get(box_id)
        if seen is None or not seen.healthy or seen.epoch is None:
            answers[box_id] = BoxReadiness(False, ("unhealthy",), None)
            continue
        if seen.warmup is not WarmupStatus.DONE or seen.warmup_finished_at is None:
            answers[box_id] = BoxReadiness(False, (f"restart warm-up {seen.warmup.value}",), None)
            continue
        if seen.draining:
            if routed is None:
                routing = desired.routing if desired.routing is not None else desired.assignment
                routed = {b for group in routing.values() for b in group}
            if box_id not in routed:
                answers[box_id] = BoxReadiness(False, ("drained for a rollout",), None)
                continue
        elif desired.placed is not None and box_id not in desired.placed:
            # warmed up since placement last looked: its agents are still elsewhere, not needless here
            answers[box_id] = BoxReadiness(False, ("waiting for placement",), None)
            continue
        if wants is None:
            wants = wanted_by_box(desired, active_agents(desired, now, config))
        answers[box_id] = _prefixes_ready(
            box_id, seen.epoch, seen.warmup_finished_at, wants.get(box_id, {}), observed
        )
    return answers


def _prefixes_ready(
    box_id: str, epoch: str, since: float, wants: Mapping[str, WantedPrefix], observed: Observed
) -> BoxReadiness:
    """Ready once every prefix kept warm on the box is believed warm in its epoch; since the latest of
    the warm-up's end and those prefixes' warming."""
    reasons: list[str] = []
    for prefix_hash in sorted(wants):
        record = observed.warm.get((box_id, epoch, prefix_hash))
        if record is None or not is_serving(record):
            state = record.state.value if record is not None else WarmState.COLD.value
            agents = ", ".join(sorted(wants[prefix_hash].agent_ids))
            reasons.append(f"agent {agents}: prefix {prefix_hash} {state}")
        elif record.warmed_at is not None:
            since = max(since, record.warmed_at)
    if reasons:
        return BoxReadiness(False, tuple(reasons), None)
    return BoxReadiness(True, (), since)


def ramp_weight(since: float, now: float, config: PlannerConfig) -> float:
    """A small slice right after becoming warm, rising linearly to full weight over the ramp."""
    if config.ramp_seconds <= 0:
        return 1.0
    elapsed = max(0.0, now - since)
    if elapsed >= config.ramp_seconds:
        return 1.0
    initial = config.ramp_initial_weight
    return initial + (1.0 - initial) * elapsed / config.ramp_seconds


@dataclass(frozen=True, slots=True)
class Route:
    box_id: str
    weight: float  # (0, 1]: ramp fraction of full weight


def agent_warmth(desired: Desired, observed: Observed) -> dict[tuple[str, str], bool]:
    """(box, agent) -> whether the agent's current prefix is believed warm in the box's current epoch on a
    healthy box, for every box the agent should be warm on or routed to (so a 0 always means missing
    warmth, never a pair nobody wants)."""
    routing = desired.routing if desired.routing is not None else desired.assignment
    result: dict[tuple[str, str], bool] = {}
    for agent_id, prefix in desired.agents.items():
        for box_id in (*desired.assignment.get(agent_id, ()), *routing.get(agent_id, ())):
            seen = observed.boxes.get(box_id)
            record = None
            if seen is not None and seen.healthy and seen.epoch is not None:
                record = observed.warm.get((box_id, seen.epoch, prefix.hash))
            result[(box_id, agent_id)] = record is not None and is_serving(record)
    return result


def routes(
    desired: Desired,
    observed: Observed,
    now: float,
    config: PlannerConfig,
    *,
    only: Collection[str] | None = None,
) -> dict[str, tuple[Route, ...]]:
    """Per agent, in spill order: only boxes of its routing group where ITS prefix is believed warm in the
    box's current epoch after that epoch's restart warm-up; a box losing either drops out at once.

    `only` limits the answer to those agents (unknown ones are left out): a pre-call ask needs one agent's
    routes, not a pass over every agent of the fleet."""
    routing = desired.routing if desired.routing is not None else desired.assignment
    agents = desired.agents if only is None else {a: desired.agents[a] for a in only if a in desired.agents}
    result: dict[str, tuple[Route, ...]] = {}
    for agent_id, prefix in agents.items():
        found: list[Route] = []
        for box_id in routing.get(agent_id, ()):
            seen = observed.boxes.get(box_id)
            if seen is None or not seen.healthy or seen.epoch is None:
                continue
            if seen.warmup is not WarmupStatus.DONE or seen.warmup_finished_at is None:
                continue
            record = observed.warm.get((box_id, seen.epoch, prefix.hash))
            if record is None or not is_serving(record) or record.warmed_at is None:
                continue
            since = max(seen.warmup_finished_at, record.warmed_at)
            found.append(Route(box_id, ramp_weight(since, now, config)))
        result[agent_id] = tuple(found)
    return result
