"""Moving from one placement to the next without a cold route: how much moves, move-before-switch, and
keeping retained boxes within their capacity."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from warmer.core.model import BoxSpec


@dataclass(frozen=True, slots=True)
class Movement:
    """How much a placement change disturbs caches: (agent, box) memberships lost from `before`."""

    memberships_before: int
    memberships_moved: int
    agents_compared: int
    agents_changed: int

    @property
    def fraction_moved(self) -> float:
        return self.memberships_moved / self.memberships_before if self.memberships_before else 0.0


def movement(before: Mapping[str, Sequence[str]], after: Mapping[str, Sequence[str]]) -> Movement:
    """Compare two assignments (agent -> boxes); order inside a group is ignored (it is spill order only)."""
    total = moved = changed = 0
    for agent, old in before.items():
        old_set = set(old)
        new_set = set(after.get(agent, ()))
        lost = len(old_set - new_set)
        total += len(old_set)
        moved += lost
        if old_set != new_set:
            changed += 1
    return Movement(
        memberships_before=total, memberships_moved=moved, agents_compared=len(before), agents_changed=changed
    )


@dataclass(frozen=True, slots=True)
class Handover:
    """Move-before-switch, per agent.

    routing: boxes traffic may use now (new boxes only once the agent's prefix is warm there);
    keep_warm: boxes whose copy of the prefix must be warmed or kept warm (target + old ones still serving);
    pending: target boxes still warming, not yet routed to.
    """

    routing: Mapping[str, tuple[str, ...]]
    keep_warm: Mapping[str, tuple[str, ...]]
    pending: Mapping[str, tuple[str, ...]]


def handover(
    previous: Mapping[str, Sequence[str]],
    target: Mapping[str, Sequence[str]],
    prefix_of: Mapping[str, str],
    warm: Collection[tuple[str, str]],
    *,
    existing: Collection[str] | None = None,
) -> Handover:
    """The effective assignment while moving from `previous` to `target`.

    `warm` holds (box id, prefix hash) pairs verified warm; `prefix_of` maps agent -> its prefix hash;
    `existing` (default: everything) lists boxes still in the fleet, so a deleted box is never retained.
    A new box joins an agent's routing only once that agent's prefix is warm on it; old boxes stay (as the
    last spill entries) until every new box has joined. An agent with no target group keeps its old boxes:
    running short of capacity must not cut its only warm route.
    """
    still_there = set(existing) if existing is not None else None
    routing: dict[str, tuple[str, ...]] = {}
    keep_warm: dict[str, tuple[str, ...]] = {}
    pending: dict[str, tuple[str, ...]] = {}
    for agent in set(previous) | set(target):
        old = [b for b in previous.get(agent, ()) if still_there is None or b in still_there]
        new = list(target.get(agent, ()))
        prefix = prefix_of.get(agent)
        old_set = set(old)
        joined = [b for b in new if b in old_set or (prefix is not None and (b, prefix) in warm)]
        waiting = [b for b in new if b not in joined]
        retained = [b for b in old if b not in set(new)] if (waiting or not new) else []
        routing[agent] = tuple(joined + retained)
        keep_warm[agent] = tuple(new + retained)
        if waiting:
            pending[agent] = tuple(waiting)
    return Handover(routing=routing, keep_warm=keep_warm, pending=pending)


def fit_to_capacity(
    moving: Handover,
    target: Mapping[str, Sequence[str]],
    prefix_of: Mapping[str, str],
    boxes: Mapping[str, BoxSpec],
    priority: Mapping[str, float],
    prefix_tokens: Mapping[str, int] | None = None,
) -> Handover:
    """Drop retained (old) memberships that would make a box hold more prefixes than it can.

    `place` keeps the target within every box's capacity, but move-before-switch keeps an agent's old boxes
    serving until its new ones are warm; on a box that is full with its new agents, such a retained prefix
    is evicted by the next warm while still routed. So the quietest retained agents (`priority`: calls per
    minute, lowest first) leave such a box at once, from both routing and keep-warm. With `prefix_tokens`
    (agent -> its prefix's tokens) a box's `cache_capacity_tokens` bounds them too: a budget that shrank with
    load (`warmer.core.capacity`) takes its quietest prefixes off the box, not only new placements.
    """
    sizes = prefix_tokens or {}
    held: dict[str, set[str]] = {}
    tokens: dict[str, int] = {}  # box -> tokens of the distinct prefixes held
    retained: list[tuple[float, str, str]] = []  # (priority, agent, box)
    for agent, group in moving.keep_warm.items():
        wanted = set(target.get(agent, ()))
        prefix = prefix_of.get(agent, f"agent:{agent}")
        for box_id in group:
            if box_id not in wanted:
                retained.append((priority.get(agent, 0.0), agent, box_id))
            elif prefix not in held.setdefault(box_id, set()):
                held[box_id].add(prefix)
                tokens[box_id] = tokens.get(box_id, 0) + sizes.get(agent, 0)
    dropped: set[tuple[str, str]] = set()
    for _, agent, box_id in sorted(retained, key=lambda item: (-item[0], item[1])):
        prefix = prefix_of.get(agent, f"agent:{agent}")
        on_box = held.setdefault(box_id, set())
        spec = boxes.get(box_id)
        limit = spec.prefix_capacity if spec is not None else None
        room = spec.cache_capacity_tokens if spec is not None and prefix_tokens is not None else None
        size = sizes.get(agent, 0)
        fits = (limit is None or len(on_box) < limit) and (
            room is None or tokens.get(box_id, 0) + size <= room
        )
        if prefix in on_box:
            continue
        if fits:
            on_box.add(prefix)
            tokens[box_id] = tokens.get(box_id, 0) + size
        else:
            dropped.add((agent, box_id))
    if not dropped:
        return moving

    def without(groups: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        return {agent: tuple(b for b in g if (agent, b) not in dropped) for agent, g in groups.items()}

    return Handover(
        routing=without(moving.routing), keep_warm=without(moving.keep_warm), pending=moving.pending
    )
