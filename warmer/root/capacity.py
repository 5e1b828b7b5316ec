"""Wiring of the capacity figures: settings -> `CapacityService`, the per-call token source, the gauge loop.

The service reads the reconciler's snapshot and the hit-rate monitor's windows. The gauges are refreshed
once per hit-rate window, since that is how often the use figures change.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping

from warmer.config.settings import Settings
from warmer.config.tokenizer import offline_renderer, offline_tokenizer
from warmer.core.agents import AgentSpec
from warmer.core.errors import ConfigError, WarmerError
from warmer.core.model import ModelProfile
from warmer.core.prefix import StablePrefix, compute_stable_prefix
from warmer.ports import Clock
from warmer.service.periodic import every_period
from warmer.service.views.capacity import CapacityConfig, CapacityService


def capacity_config(settings: Settings) -> CapacityConfig:
    """The capacity knobs from `[capacity]`."""
    section = settings.capacity
    return CapacityConfig(
        safe_fraction=section.safe_fraction, max_usage_age_seconds=section.max_usage_age_seconds
    )


class OfflineStablePrefixes:
    """An agent's stable prefix computed offline like `warmer lint` (and `warmer hitrate --calls`), cached per
    spec content. None when the profile cannot render offline or the agent is not configured here."""

    def __init__(self, agents: Callable[[], Mapping[str, AgentSpec]], profiles: Mapping[str, ModelProfile]):
        self._agents = agents
        self._profiles = profiles
        self._known: dict[str, StablePrefix | None] = {}
        # agent -> (the spec object, its content hash): the capacity report asks for every agent once per
        # hit-rate window, and hashing a spec (canonical JSON, SHA-256) is ~20-70 µs: at 1,000 agents
        # tens of milliseconds of the event loop per report, for specs that are the same (frozen) objects
        self._hashed: dict[str, tuple[AgentSpec, str]] = {}

    async def __call__(self, agent_id: str) -> StablePrefix | None:
        spec = self._agents().get(agent_id)
        if spec is None:
            return None
        key = self._hash_of(agent_id, spec)
        if key not in self._known:
            self._known[key] = await asyncio.to_thread(self._compute, spec)
        return self._known[key]

    def _hash_of(self, agent_id: str, spec: AgentSpec) -> str:
        hashed = self._hashed.get(agent_id)
        if hashed is None or hashed[0] is not spec:
            hashed = self._hashed[agent_id] = (spec, spec.spec_hash)
        return hashed[1]

    def _compute(self, spec: AgentSpec) -> StablePrefix | None:
        profile = self._profiles.get(spec.model)
        if profile is None:
            return None
        try:
            return compute_stable_prefix(spec, offline_renderer(profile), offline_tokenizer(profile))
        except ConfigError:
            return None

    async def call_tokens(self, agent_id: str) -> int | None:
        """Uncached tokens of the agent's turn-1 prompt on a warm box (turn-1 prompt minus its prefix)."""
        stable = await self(agent_id)
        return None if stable is None else max(1, stable.turn1_prompt_tokens - stable.token_count)

    async def stable_share(self, agent_id: str) -> float | None:
        """The prefix's share of the agent's turn-1 prompt: its depth."""
        stable = await self(agent_id)
        return None if stable is None else stable.stable_share


async def run_capacity_gauges(
    service: CapacityService, clock: Clock, period_seconds: float, stopping: asyncio.Event
) -> None:
    """The `capacity` root task: recompute the report (which sets the gauges) once per period."""

    async def recompute() -> None:
        with contextlib.suppress(WarmerError):  # a store outage: the next period asks again
            await service.report()

    await every_period(recompute, clock, period_seconds, stopping)
