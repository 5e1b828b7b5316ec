"""Deploy state every replica must agree on: rollout drains, rollout epoch tags, webhook fleet changes.

They are written to the store by whichever replica received the event, in the transaction that remembers
the event id, and every replica reads them back each pass: a daemon restart keeps a rollout in progress,
and an event sent to any replica takes effect on all (a repeat sent to another one is a duplicate there).

The fleet is the configured boxes, minus the boxes a `box.removed` event took out, plus the boxes a
`box.added` event brought in (its spec as the event gave it). A later event about the same box replaces
an earlier one, so a removed box comes back with a new `box.added`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from warmer.core.model import BoxSpec, CacheTier, EngineKind


@dataclass(frozen=True, slots=True)
class RolloutMark:
    """A box's rollout state: drained (with why) while a rollout is in progress, and the tag that makes its
    epoch new once the rollout finished (`<engine epoch>~<tag>`)."""

    box_id: str
    drain_reason: str | None
    epoch_tag: str | None
    event_id: str
    at: float


@dataclass(frozen=True, slots=True)
class FleetChange:
    """The latest webhook fleet change of one box: `added` is its spec, None when it was removed."""

    box_id: str
    added: BoxSpec | None
    event_id: str
    at: float


@dataclass(frozen=True, slots=True)
class StateChange:
    """What one deploy event changes in the shared state (applied atomically with its event id)."""

    drain: Mapping[str, str] = field(default_factory=dict)  # box id -> reason
    undrain: Mapping[str, str] = field(default_factory=dict)  # box id -> epoch tag
    add: BoxSpec | None = None
    remove: str | None = None


@dataclass(frozen=True, slots=True)
class SharedFleetState:
    rollouts: Mapping[str, RolloutMark] = field(default_factory=dict)
    changes: Mapping[str, FleetChange] = field(default_factory=dict)

    def drains(self) -> dict[str, str]:
        return {b: m.drain_reason for b, m in self.rollouts.items() if m.drain_reason is not None}

    def epoch_tags(self) -> dict[str, str]:
        return {b: m.epoch_tag for b, m in self.rollouts.items() if m.epoch_tag is not None}

    def fleet(self, configured: Sequence[BoxSpec]) -> list[BoxSpec]:
        """The boxes to run: configured order first, then added boxes by id."""
        boxes: list[BoxSpec] = []
        for box in configured:
            change = self.changes.get(box.id)
            if change is None:
                boxes.append(box)
            elif change.added is not None:
                boxes.append(change.added)
        listed = {box.id for box in boxes}
        for box_id in sorted(self.changes):
            added = self.changes[box_id].added
            if added is not None and box_id not in listed:
                boxes.append(added)
        return boxes


def box_to_data(box: BoxSpec) -> dict[str, object]:
    """A box spec as JSON-able data (stored with its `box.added` change)."""
    return {
        "id": box.id,
        "base_url": box.base_url,
        "engine": box.engine.value,
        "model": box.model,
        "slots": box.slots,
        "group": box.group,
        "cache_capacity_tokens": box.cache_capacity_tokens,
        "prefix_capacity": box.prefix_capacity,
        "warm_tier": box.warm_tier.value,
        "warm_priority": box.warm_priority,
    }


def box_from_data(data: Mapping[str, object]) -> BoxSpec:
    """The inverse of `box_to_data`; a malformed row raises ValueError naming the field."""

    def text(name: str) -> str:
        value = data.get(name)
        if not isinstance(value, str):
            raise ValueError(f"{name}: expected a string, got {value!r}")
        return value

    def optional_int(name: str) -> int | None:
        value = data.get(name)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name}: expected an integer, got {value!r}")
        return value

    slots = optional_int("slots")
    return BoxSpec(
        id=text("id"),
        base_url=text("base_url"),
        engine=EngineKind(text("engine")),
        model=text("model"),
        slots=1 if slots is None else slots,
        group=text("group") if data.get("group") is not None else "",
        cache_capacity_tokens=optional_int("cache_capacity_tokens"),
        prefix_capacity=optional_int("prefix_capacity"),
        warm_tier=CacheTier(text("warm_tier")) if data.get("warm_tier") is not None else CacheTier.DEVICE,
        warm_priority=optional_int("warm_priority"),
    )
