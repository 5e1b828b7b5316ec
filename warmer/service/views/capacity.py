"""`GET /v1/capacity` and the capacity gauges: per agent group, the uncached prefill budget left.

Reads what the daemon already has, and adds no scraper of its own:
* routes and epochs from the reconciler's snapshot (the same read-only view `/v1/routes` answers from);
* each box's use from the hit-rate monitor's counter windows (`UncachedRateSource`);
* each box's ceiling from the profile's `prefill_tokens_per_second` when set, else from the restart
  warm-up's long prefill of the box's current epoch: exact when this daemon saw that request
  (`PrefillCeilings.record_long_prefill`, fed by `RestartWarmup`), else a conservative estimate from the
  phase record in the store (see `_ceiling_from_phase`).
The arithmetic is `warmer.core.capacity`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from warmer.core.capacity import (
    DEFAULT_SAFE_FRACTION,
    AgentCapacity,
    BoxCapacity,
    PrefillCeiling,
    Shortfall,
    UncachedRate,
    agent_capacity,
    box_capacity,
    ceiling_from_prefill,
    shortfall,
)
from warmer.core.errors import WarmerError
from warmer.core.model import BoxSpec, CompletionReport, ModelProfile, PhaseName, PhaseRecord
from warmer.ports import Clock, StorePort
from warmer.service.engine_work.restart_warmup import long_prefill_target
from warmer.service.reconciler import Snapshot


class UncachedRateSource(Protocol):
    """Per box, the uncached tokens/s of its last counter window (the hit-rate monitor implements it)."""

    def uncached_rates(self) -> Mapping[str, UncachedRate]: ...


class CapacityObserver(Protocol):
    """Where each computed report goes (the root sets Prometheus gauges from it)."""

    def capacity(self, boxes: Sequence[BoxCapacity], agents: Sequence[AgentCapacity]) -> None: ...


@dataclass(frozen=True, slots=True)
class CapacityConfig:
    safe_fraction: float = DEFAULT_SAFE_FRACTION
    # A counter window older than this says nothing about now (the monitor stopped or the box is failing).
    max_usage_age_seconds: float = 180.0

    def __post_init__(self) -> None:
        if not 0.0 < self.safe_fraction <= 1.0:
            raise ValueError("safe_fraction must be within (0, 1]")
        if self.max_usage_age_seconds <= 0:
            raise ValueError("max_usage_age_seconds must be > 0")


@dataclass(frozen=True, slots=True)
class CapacityReport:
    safe_fraction: float
    boxes: tuple[BoxCapacity, ...]
    agents: tuple[AgentCapacity, ...]
    shortfall: Shortfall | None = None  # None before the first pass


class PrefillCeilings:
    """Measured prefill ceilings per box, for the epoch they were measured in (a restart forgets them).

    `record_long_prefill` is `RestartWarmup`'s hook: the long prefill is one request of nearly the whole
    context with one output token, so computed tokens / the engine's prompt seconds is the box's rate at
    full prefill load. The engine's prompt time is used when it reports one (llama.cpp `timings.prompt_ms`),
    else its whole request time.
    """

    def __init__(self) -> None:
        self._by_box: dict[str, tuple[str, float]] = {}

    def record_long_prefill(self, box: BoxSpec, epoch: str, report: CompletionReport) -> None:
        seconds = report.prompt_seconds if report.prompt_seconds is not None else report.engine_seconds
        rate = ceiling_from_prefill(report.prompt_tokens, report.cached_tokens, seconds)
        if rate is not None:
            self._by_box[box.id] = (epoch, rate)

    def measured(self, box_id: str, epoch: str | None) -> float | None:
        found = self._by_box.get(box_id)
        if found is None or epoch is None or found[0] != epoch:
            return None
        return found[1]


PerCallTokens = Callable[[str], Awaitable[int | None]]


class CapacityService:
    """Builds the capacity report from the reconciler snapshot, the monitor's windows and the ceilings."""

    def __init__(
        self,
        *,
        snapshot: Callable[[], Snapshot],
        usage: UncachedRateSource | None,
        ceilings: PrefillCeilings,
        profiles: Mapping[str, ModelProfile],
        store: StorePort,
        clock: Clock,
        config: CapacityConfig | None = None,
        per_call_tokens: PerCallTokens | None = None,
        observer: CapacityObserver | None = None,
    ) -> None:
        self._snapshot = snapshot
        self._usage = usage
        self._ceilings = ceilings
        self._profiles = profiles
        self._store = store
        self._clock = clock
        self._config = config or CapacityConfig()
        self._per_call_tokens = per_call_tokens
        self._observer = observer
        self._phase_ceilings: dict[tuple[str, str], float] = {}

    async def report(self) -> CapacityReport:
        snapshot = self._snapshot()
        source = self._usage
        rates = dict(source.uncached_rates()) if source is not None else {}
        now = self._clock.monotonic()
        epochs = {b: live.epoch for b, live in snapshot.live.items() if b in snapshot.boxes}
        ceilings = await self._ceilings_of(snapshot, epochs)
        boxes = []
        for box_id in sorted(snapshot.boxes):
            rate = rates.get(box_id)
            if rate is not None and now - rate.at > self._config.max_usage_age_seconds:
                rate = None
            ceiling = ceilings.get(box_id)
            boxes.append(box_capacity(box_id, ceiling, rate, safe_fraction=self._config.safe_fraction))
        await asyncio.sleep(0)  # a turn of the event loop for the pre-call asks between the steps
        routed = {agent: tuple(r.box_id for r in found) for agent, found in snapshot.routes().items()}
        for agent_id in snapshot.prefixes:
            routed.setdefault(agent_id, ())
        await asyncio.sleep(0)
        per_call: dict[str, int] = {}
        if self._per_call_tokens is not None:
            for agent_id in routed:
                tokens = await self._per_call_tokens(agent_id)
                if tokens is not None:
                    per_call[agent_id] = tokens
        by_id = {b.box_id: b for b in boxes}
        await asyncio.sleep(0)
        agents = agent_capacity(routed, by_id, uncached_tokens_per_call=per_call)
        if self._observer is not None:
            self._observer.capacity(boxes, agents)
        missing = None
        if snapshot.desired is not None:
            sizes = {agent: ref.tokens for agent, ref in snapshot.desired.agents.items()}
            missing = shortfall(sizes, snapshot.desired.assignment)
        return CapacityReport(self._config.safe_fraction, tuple(boxes), tuple(agents), missing)

    async def _ceilings_of(
        self, snapshot: Snapshot, epochs: Mapping[str, str | None]
    ) -> dict[str, PrefillCeiling | None]:
        """Each box's prefill ceiling: its profile's, else measured, else from its epoch's long-prefill
        phase (the phases of every box still without one read in one query, not one per box)."""
        found: dict[str, PrefillCeiling | None] = {}
        unread: dict[str, str] = {}
        for box_id, box in snapshot.boxes.items():
            profile = self._profiles.get(box.model)
            epoch = epochs.get(box_id)
            found[box_id] = None
            if profile is not None and profile.prefill_tokens_per_second is not None:
                found[box_id] = PrefillCeiling(profile.prefill_tokens_per_second, "profile")
            elif (measured := self._ceilings.measured(box_id, epoch)) is not None:
                found[box_id] = PrefillCeiling(measured, "measured")
            elif epoch is not None and profile is not None:
                cached = self._phase_ceilings.get((box_id, epoch))
                if cached is None:
                    unread[box_id] = epoch
                else:
                    found[box_id] = PrefillCeiling(cached, "warmup_phase")
        if not unread:
            return found
        try:
            phases = await self._store.phases_of(unread)
        except WarmerError:
            return found  # the store is down: no estimate this time, asked again next time
        longest = _longest_assigned_prefixes(snapshot)
        for box_id, epoch in unread.items():
            profile = self._profiles[snapshot.boxes[box_id].model]
            rate = _ceiling_from_phases(phases.get(box_id, []), profile, longest.get(box_id))
            if rate is not None:
                self._phase_ceilings[(box_id, epoch)] = rate
                found[box_id] = PrefillCeiling(rate, "warmup_phase")
        return found


def _ceiling_from_phases(
    phases: Sequence[PhaseRecord], profile: ModelProfile, longest_prefix: int | None
) -> float | None:
    """The long-prefill phase an earlier daemon recorded: a lower bound of its prompt tokens over its
    engine seconds, so the estimate errs low (pacing to it never overloads the box).

    The record holds no token count. The prompt was sized to 97-100% of the warm-up's target, which is
    at most the context minus the recipe margin and, where the warm-up sizes it from the real prompts,
    at least the longest stable prefix it serves: the smaller of the two is taken."""
    for phase in phases:
        if phase.phase is PhaseName.LONG_PREFILL and phase.ok and phase.requests == 1:
            tokens = long_prefill_target(profile.restart, profile)
            if longest_prefix:
                tokens = min(tokens, longest_prefix)
            rate = ceiling_from_prefill(tokens, 0, phase.engine_seconds)
            if rate is not None and math.isfinite(rate):
                return rate
    return None


def _longest_assigned_prefixes(snapshot: Snapshot) -> dict[str, int]:
    """Box -> tokens of the longest stable prefix among the agents assigned to it (boxes with none known
    are left out)."""
    longest: dict[str, int] = {}
    if snapshot.desired is None:
        return longest
    for agent_id, group in snapshot.desired.assignment.items():
        computed = snapshot.prefixes.get(agent_id)
        if computed is None:
            continue
        for box_id in group:
            longest[box_id] = max(longest.get(box_id, 0), computed.prefix.token_count)
    return longest
