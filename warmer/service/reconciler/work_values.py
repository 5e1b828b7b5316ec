"""What a piece of engine work is worth, for the fleet pacer's most-valuable-first order.

A warm is worth the prefill its prefix saves a minute for the agents sharing it; a restart warm-up is
worth what its box holds (`warmer.core.fleet_pacing.box_values`), so after a region restart the boxes of
the busiest agents come back first. Placement gives a restarted box's agents to others until its warm-up
is done, so a box keeps the value it had when it last held agents (`carried_values`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from warmer.core.fleet_pacing import WorkKind, box_values, carried_values, warm_value


@dataclass(frozen=True, slots=True)
class EngineTicket:
    """What the fleet pacer is told of a warm or probe: its kind, worth, uncached tokens and urgency."""

    kind: WorkKind
    value: float
    cost: float
    urgent: bool


class WorkValues:
    """Box values, recomputed when placement changes (and, lazily, when only the volume did)."""

    def __init__(self) -> None:
        self._values: dict[str, float] = {}
        self._placement: Mapping[str, Iterable[str]] | None = None
        self._volume: Mapping[str, float] = {}
        self._tokens: Mapping[str, int] = {}
        self._stale = False

    def note(
        self, placement: Mapping[str, Iterable[str]], volume: Mapping[str, float], tokens: Mapping[str, int]
    ) -> None:
        """This pass's placement (agent -> its boxes), volume (calls/minute) and prefix tokens per agent."""
        moved = placement is not self._placement
        self._stale = self._stale or moved or volume != self._volume or tokens != self._tokens
        self._placement, self._volume, self._tokens = placement, volume, tokens
        if moved:
            self._recompute()  # before the next change drops a restarted box's agents from it

    def _recompute(self) -> None:
        if self._placement is not None:
            self._values = carried_values(
                self._values, box_values(self._placement, self._volume, self._tokens)
            )
        self._stale = False

    def box(self, box_id: str) -> float:
        if self._stale:
            self._recompute()
        return self._values.get(box_id, 0.0)

    def warm(self, agent_ids: Iterable[str], prefix_tokens: int) -> float:
        return warm_value(agent_ids, prefix_tokens, self._volume)

    def ticket(
        self, agents: Iterable[str], prefix_tokens: int, requests: int, *, probe: bool, urgent: bool
    ) -> EngineTicket:
        """A warm (prefix x requests uncached tokens, the planner's charge) or a probe (the prefix)."""
        kind = WorkKind.PROBE if probe else WorkKind.WARM
        cost = float(prefix_tokens * (1 if probe else requests))
        return EngineTicket(kind, self.warm(agents, prefix_tokens), cost, urgent)
