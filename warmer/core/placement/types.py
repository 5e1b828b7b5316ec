"""What placement takes and gives: agents' demand, the configuration, the resulting groups."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class AgentDemand:
    """What placement needs to know about one agent."""

    agent_id: str
    model: str
    prefix_tokens: int
    calls_per_minute: float = 0.0  # configured or observed volume; sizes the group
    group_size: int | None = None  # a configured size wins over volume
    prefix_hash: str = ""  # agents with the same prefix share one cache entry on a box

    def __post_init__(self) -> None:
        if not self.agent_id:
            raise ValueError("agent_id must not be empty")
        if self.prefix_tokens < 0:
            raise ValueError(f"{self.agent_id}: prefix_tokens must be >= 0")
        if self.calls_per_minute < 0:
            raise ValueError(f"{self.agent_id}: calls_per_minute must be >= 0")
        if self.group_size is not None and self.group_size < 1:
            raise ValueError(f"{self.agent_id}: group_size must be >= 1")

    @property
    def prefix_key(self) -> str:
        """What a box holds for this agent: its shared prefix, or a prefix of its own."""
        return self.prefix_hash or f"agent:{self.agent_id}"


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    max_agents_per_box: int = 8
    min_group_size: int = 2  # spill room even for a quiet agent
    max_group_size: int = 8
    calls_per_minute_per_box: float = 30.0  # volume one box absorbs for one agent; busier agents get more
    dedicated_calls_per_minute: float | None = None  # at or above this, the agent's boxes serve it alone
    hash_buckets: int = 64  # fixed forever for a fleet: changing it reshuffles everything

    def __post_init__(self) -> None:
        if self.max_agents_per_box < 1:
            raise ValueError("max_agents_per_box must be >= 1")
        if self.min_group_size < 1:
            raise ValueError("min_group_size must be >= 1")
        if self.max_group_size < self.min_group_size:
            raise ValueError("max_group_size must be >= min_group_size")
        if self.calls_per_minute_per_box <= 0:
            raise ValueError("calls_per_minute_per_box must be > 0")
        if self.dedicated_calls_per_minute is not None and self.dedicated_calls_per_minute <= 0:
            raise ValueError("dedicated_calls_per_minute must be > 0")
        if self.hash_buckets < 1:
            raise ValueError("hash_buckets must be >= 1")

    def wanted_group_size(self, agent: AgentDemand) -> int:
        """Configured size, else enough boxes for the agent's volume, within [min, max]."""
        if agent.group_size is not None:
            return agent.group_size
        by_volume = math.ceil(agent.calls_per_minute / self.calls_per_minute_per_box)
        return max(self.min_group_size, min(self.max_group_size, by_volume))

    def is_dedicated(self, agent: AgentDemand) -> bool:
        threshold = self.dedicated_calls_per_minute
        return threshold is not None and agent.calls_per_minute >= threshold


class UnplacedReason(enum.StrEnum):
    NO_BOXES = "no_boxes"  # no eligible box serves the agent's model
    CAPACITY = "capacity"  # boxes exist but every one is at its agent cap or cache capacity


@dataclass(frozen=True, slots=True)
class Placement:
    """Agent -> ordered box group (first = preferred, the rest = spill order), plus who did not fit.

    The order of agents inside the mappings carries no meaning; the order of boxes inside a group does.
    """

    groups: Mapping[str, tuple[str, ...]]
    wanted: Mapping[str, int]
    unplaced: Mapping[str, UnplacedReason] = field(default_factory=dict)
    dedicated: frozenset[str] = frozenset()

    def short(self) -> dict[str, int]:
        """Agents placed on fewer boxes than they want -> how many boxes are missing."""
        return {
            agent: self.wanted[agent] - len(group)
            for agent, group in self.groups.items()
            if len(group) < self.wanted[agent]
        }

    def agents_by_box(self) -> dict[str, list[str]]:
        by_box: dict[str, list[str]] = {}
        for agent, group in self.groups.items():
            for box in group:
                by_box.setdefault(box, []).append(agent)
        return by_box
