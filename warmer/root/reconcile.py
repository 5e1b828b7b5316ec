"""Wiring of the reconciler: settings -> planner config, the offline prefix source, metrics, and timers.

APScheduler (3.x) lives here and only here: it owns the periodic wake-ups: a full reconcile pass
(`poke()`) every interval, and the light health poll (`poll_health()`, which wakes a pass only when a box
changed) every health interval. Jobs are coroutine functions so they run on the event loop
(AsyncIOScheduler runs plain functions in a thread pool, where touching an asyncio.Event is unsafe).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from warmer.config.settings import Settings
from warmer.config.tokenizer import offline_engine_version, offline_renderer, offline_tokenizer
from warmer.core.agents import AgentSpec
from warmer.core.fleet_pacing import FleetBudget
from warmer.core.model import ModelProfile
from warmer.core.planner import PlannerConfig
from warmer.core.prefix import RenderFn, TokenizeFn, compute_stable_prefix
from warmer.core.warm_budget import WarmBudget
from warmer.service.reconciler import ComputedPrefix, ReconcilerConfig

# Smallest uncached-token bucket per box: one long prefix must fit from a full bucket without debt.
MIN_BURST_TOKENS = 20000.0


def reconciler_config(settings: Settings) -> ReconcilerConfig:
    """The planner's knobs from `[reconcile]`, the dialer's pre-call hold and campaign lead, and the prefix
    budget's reading period, headroom and band from `[capacity]`."""
    loop = settings.reconcile
    rate = float(loop.warm_budget_tokens_per_second)
    return ReconcilerConfig(
        planner=PlannerConfig(
            budget=WarmBudget(
                max_concurrent=loop.max_concurrent_warms_per_box,
                tokens_per_second=rate,
                burst_tokens=max(MIN_BURST_TOKENS, 4 * rate),
            ),
            keepalive_jitter=loop.keepalive_jitter_fraction,
            ramp_seconds=loop.ramp_seconds,
            ramp_initial_weight=loop.initial_ramp_weight,
            campaign_lead_seconds=settings.dialer.campaign_lead_seconds,
            retire_idle_after_seconds=loop.retire_idle_after(),
        ),
        precall_hold_seconds=settings.dialer.precall_hold_seconds,
        precall_lend_seconds=settings.dialer.precall_lend_seconds,
        precall_protect_seconds=settings.dialer.precall_protect_seconds,
        precall_call_hold_seconds=settings.dialer.call_hold_seconds,
        health_slow_polls_allowed=loop.health_slow_polls_allowed,
        health_poll_seconds=loop.health_poll_seconds,
        capacity_poll_seconds=settings.capacity.prefix_poll_seconds,
        prefix_budget=settings.capacity.prefix_budget(),
        gate=settings.gate.config(),
        fleet_budget=FleetBudget(
            tokens_per_second=float(loop.fleet_warm_tokens_per_second) or None,
            warm_share=loop.fleet_warm_share,
            max_in_flight=loop.fleet_warm_max_in_flight,
            max_wait_seconds=loop.fleet_warm_max_wait_seconds,
        ),
    )


class OfflinePrefixSource:
    """Stable prefixes from the model profile's chat template and tokenizer file, as `warmer render`
    computes them. The work is CPU-bound (render + tokenize a few samples), so it runs in a thread.

    The recorded engine version is the tokenizer file's name and content digest
    (`offline_engine_version`): what actually counted the tokens, so a replaced tokenizer file shows up
    as a new version in the drift history. `warmer lint` computes the same string."""

    def __init__(self) -> None:
        self._tools: dict[str, tuple[RenderFn, TokenizeFn, str]] = {}

    def _tools_for(self, profile: ModelProfile) -> tuple[RenderFn, TokenizeFn, str]:
        tools = self._tools.get(profile.name)
        if tools is None:
            tools = self._tools[profile.name] = (
                offline_renderer(profile),
                offline_tokenizer(profile),
                offline_engine_version(profile),
            )
        return tools

    async def __call__(self, spec: AgentSpec, profile: ModelProfile) -> ComputedPrefix:
        render, tokenize, version = self._tools_for(profile)
        stable = await asyncio.to_thread(compute_stable_prefix, spec, render, tokenize)
        return ComputedPrefix(prefix=stable.as_prefix(), engine_version=version)


async def run_timers(
    settings: Settings,
    poke: Callable[[], None],
    poll_health: Callable[[], Awaitable[None]],
    stopping: asyncio.Event,
) -> None:
    """The `scheduler` root task: a full pass every `interval_seconds`, a health poll every
    `health_poll_seconds`."""

    async def wake() -> None:
        poke()

    async def health() -> None:
        await poll_health()

    scheduler = AsyncIOScheduler(event_loop=asyncio.get_running_loop(), timezone="UTC")
    common = {"coalesce": True, "max_instances": 1, "misfire_grace_time": None}
    scheduler.add_job(
        wake,
        "interval",
        seconds=settings.reconcile.interval_seconds,
        id="reconcile",
        name="reconcile tick",
        **common,
    )
    scheduler.add_job(
        health,
        "interval",
        seconds=settings.reconcile.health_poll_seconds,
        id="health-poll",
        name="health poll",
        **common,
    )
    scheduler.start()
    try:
        await stopping.wait()
    finally:
        scheduler.shutdown(wait=False)
