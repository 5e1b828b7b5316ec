"""Turn-1 hit rate live: the usage a dialer reports per LLM turn (`POST /v1/usage`), kept in a bounded
in-memory window and reported by the same analysis as `warmer hitrate --calls` (`warmer.core.call_report`).

The window holds at most `max_records` turns (the oldest leaves first) for at most `max_age_seconds`. A
record names a call and a turn: the same turn sent again (a dialer's retry) replaces it instead of counting
twice. Agents and boxes must be ones the daemon knows, so a typo is a clear 404 and the per-agent and per-box
gauges stay within the fleet. Nothing is stored: a restart starts an empty window, which is what a live
figure should be (the log file, read by the CLI, is the record).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

from warmer.core.call_report import CallUsageOptions, CallUsageReport, analyze_call_usage
from warmer.core.call_usage import UsageRecord
from warmer.ports import Clock

StableShare = Callable[[str], Awaitable[float | None]]


class UnknownUsageLabel(LookupError):
    """A record names an agent or a box the daemon does not know (404)."""

    def __init__(self, field: str, value: str) -> None:
        super().__init__(f"unknown {field} {value!r}")
        self.field = field
        self.message = f"unknown {field} {value!r}"


@dataclass(frozen=True, slots=True)
class UsageWindowConfig:
    max_records: int = 10_000
    max_age_seconds: float = 3600.0

    def __post_init__(self) -> None:
        if self.max_records < 1:
            raise ValueError("max_records must be >= 1")
        if self.max_age_seconds <= 0:
            raise ValueError("max_age_seconds must be > 0")


@dataclass(frozen=True, slots=True)
class UsageAccepted:
    duplicate: bool  # the call's turn was already in the window: replaced, not counted twice
    window_records: int


async def _no_stable_share(agent_id: str) -> float | None:
    return None


class UsageService:
    """The window of reported turns and the report over it."""

    def __init__(
        self,
        *,
        clock: Clock,
        agents: Callable[[], Collection[str]],
        boxes: Callable[[], Collection[str]],
        stable_share: StableShare = _no_stable_share,
        config: UsageWindowConfig | None = None,
        options: CallUsageOptions | None = None,
    ) -> None:
        """`stable_share`: warmer's stable-prefix share of the agent's turn-1 prompt (its depth), None when it
        cannot be computed; asked when a record of the agent arrives, so reports never wait for it."""
        self._clock = clock
        self._agents = agents
        self._boxes = boxes
        self._stable_share = stable_share
        self._config = config or UsageWindowConfig()
        self._options = options
        # (call id, turn) -> (record, monotonic seconds received), oldest first
        self._window: dict[tuple[str, int], tuple[UsageRecord, float]] = {}
        self._shares: dict[str, float | None] = {}

    async def record(self, record: UsageRecord) -> UsageAccepted:
        """Add one turn's usage (replacing the same call's same turn). Raises `UnknownUsageLabel`."""
        if record.agent and record.agent not in self._agents():
            raise UnknownUsageLabel("agent", record.agent)
        if record.box and record.box not in self._boxes():
            raise UnknownUsageLabel("box", record.box)
        if record.agent:
            self._shares[record.agent] = await self._stable_share(record.agent)
        now = self._clock.monotonic()
        key = (record.call_id, record.turn)
        duplicate = self._window.pop(key, None) is not None
        self._window[key] = (record, now)  # last in the order: the newest
        while len(self._window) > self._config.max_records:
            del self._window[next(iter(self._window))]
        self._prune(now)
        return UsageAccepted(duplicate, len(self._window))

    def _prune(self, now: float) -> None:
        oldest = now - self._config.max_age_seconds
        while self._window:
            key = next(iter(self._window))
            if self._window[key][1] >= oldest:
                return
            del self._window[key]

    def report(self) -> CallUsageReport:
        """The analysis of `warmer hitrate --calls` over the window as it is now."""
        self._prune(self._clock.monotonic())
        records = [record for record, _ in self._window.values()]
        agents = {r.agent for r in records}
        shares = {a: s for a, s in self._shares.items() if s is not None and a in agents}
        return analyze_call_usage(records, stable_shares=shares, options=self._options)
