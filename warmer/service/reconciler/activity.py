"""Agent activity: when each agent last had traffic, and which agents hold a pre-call priority.

The planner stops keeping an agent warm once it has been idle longer than
`[reconcile] retire_idle_after_seconds` (`Desired.last_activity`); a pre-call hold keeps it at top
priority for `[dialer] precall_hold_seconds` after an ask.
"""

from __future__ import annotations


class AgentActivity:
    """Last traffic per agent (unix seconds) and pre-call holds (agent -> held until)."""

    def __init__(self, hold_seconds: float) -> None:
        self._hold_seconds = hold_seconds
        self._last: dict[str, float] = {}
        self._holds: dict[str, float] = {}

    def touch(self, agent_id: str, now: float) -> None:
        """Traffic for the agent now."""
        self._last[agent_id] = now

    def first_seen(self, agent_id: str, now: float) -> None:
        """A new agent (or prompt) is warmed before its first call: it counts as active from now on,
        unless traffic was already seen."""
        self._last.setdefault(agent_id, now)

    def precall(self, agent_id: str, now: float) -> None:
        """A pre-call ask: traffic, and top priority for the hold."""
        self._last[agent_id] = now
        self._holds[agent_id] = now + self._hold_seconds

    def held(self, now: float) -> frozenset[str]:
        """Agents whose pre-call hold still runs (expired holds are dropped)."""
        self._holds = {agent: until for agent, until in self._holds.items() if until > now}
        return frozenset(self._holds)

    def last(self) -> dict[str, float]:
        return dict(self._last)
