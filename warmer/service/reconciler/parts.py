"""The reconciler's parts, built and wired: which part holds which state, and which parts read it.

Each part is a small class owning its state (`records`, `restart_detection`, `catalogue`, `desired`,
`actions`, ...); they share the fleet's dicts (boxes, profiles, agents) by reference and reach the loop
only through `Hooks`. `Reconciler` (`loop`) builds them here once and runs the passes over them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from warmer.core.agents import AgentSpec
from warmer.core.model import BoxSpec, ModelProfile
from warmer.core.readiness import Route
from warmer.ports import Clock, EnginePort, StorePort
from warmer.service.engine_work.fleet_pacer import FleetPacer
from warmer.service.engine_work.restart_warmup import RestartWarmup
from warmer.service.engine_work.warming import WarmExecutor
from warmer.service.reconciler.actions import ActionRunner
from warmer.service.reconciler.activity import AgentActivity
from warmer.service.reconciler.catalogue import PrefixCatalogue
from warmer.service.reconciler.desired import DesiredState
from warmer.service.reconciler.evictions import EvictionReactions
from warmer.service.reconciler.fleet_edits import FleetEdits, Rollout
from warmer.service.reconciler.loans import PrefixLoans
from warmer.service.reconciler.precall import PrecallWarming
from warmer.service.reconciler.prompts import PromptPromotion, PromptStaging
from warmer.service.reconciler.ready_reports import ReadyReports
from warmer.service.reconciler.records import WarmBook
from warmer.service.reconciler.replicas import ReplicaSync
from warmer.service.reconciler.restart_detection import BoxHealth
from warmer.service.reconciler.side_requests import SideRequests
from warmer.service.reconciler.tokenizer_drift import TokenizerDriftCheck
from warmer.service.reconciler.types import PrefixSource, ReconcileObserver, ReconcilerConfig
from warmer.service.replicas.replica_gate import ReplicaGate


@dataclass(frozen=True, slots=True)
class Hooks:
    """What the parts may ask of the loop."""

    poke: Callable[[], None]  # wake a pass
    notify_changed: Callable[[], None]  # readiness or routes changed between passes
    changed: Callable[[], asyncio.Event]  # the event the next pass (or change) sets
    recheck_box: Callable[[str], Awaitable[None]]  # look at one box now, between health polls
    routes_now: Callable[[float], Mapping[str, tuple[Route, ...]] | None]  # None before the first pass
    agent_routes: Callable[[str], tuple[Route, ...]]
    joining_routes: Callable[[str], tuple[Route, ...]]  # with the group's verified boxes joined
    lent_routes: Callable[[str, tuple[str, ...]], tuple[Route, ...]]  # over the boxes lent to the agent


@dataclass(frozen=True, slots=True)
class Parts:
    book: WarmBook
    rollout: Rollout
    health: BoxHealth
    activity: AgentActivity
    catalogue: PrefixCatalogue
    staging: PromptStaging
    ready: ReadyReports
    desired: DesiredState
    runner: ActionRunner
    promotion: PromptPromotion
    fleet: FleetEdits
    precall: PrecallWarming
    side: SideRequests
    replicas: ReplicaSync
    evictions: EvictionReactions
    loans: PrefixLoans


def build_parts(
    *,
    engine: EnginePort,
    store: StorePort,
    clock: Clock,
    config: ReconcilerConfig,
    boxes: dict[str, BoxSpec],
    profiles: dict[str, ModelProfile],
    agents: dict[str, AgentSpec],
    prefix_source: PrefixSource,
    executor: WarmExecutor | None,
    restart: RestartWarmup | None,
    observer: ReconcileObserver,
    demand: Callable[[], Mapping[str, float]] | None,
    lock: asyncio.Lock,
    log: structlog.stdlib.BoundLogger,
    hooks: Hooks,
    gate: ReplicaGate | None = None,
    on_fleet_change: Callable[[Sequence[BoxSpec]], None] | None = None,
) -> Parts:
    owns = (lambda _box_id: True) if gate is None else gate.owns
    book = WarmBook(store)
    rollout = Rollout(boxes)
    health = BoxHealth(
        engine=engine,
        store=store,
        clock=clock,
        log=log,
        book=book,
        box_ids=boxes,
        epoch_tag=rollout.epoch_tag,
        concurrency=config.health_concurrency,
        slow_polls_allowed=config.health_slow_polls_allowed,
        owns=owns,
        capacity_poll_seconds=config.capacity_poll_seconds,
        prefix_budget=config.prefix_budget,
        sharing=gate if gate is not None and gate.shares_health else None,
        repoll_after_seconds=config.health_poll_seconds,
    )
    activity = AgentActivity(config.precall_hold_seconds)
    drift = TokenizerDriftCheck(
        store=store, observer=observer, log=log, threshold=config.tokenizer_drift_threshold
    )
    catalogue = PrefixCatalogue(store=store, source=prefix_source, drift=drift, activity=activity, log=log)
    staging = PromptStaging(store=store, prefix_source=prefix_source, log=log)
    ready = ReadyReports(
        store=store,
        clock=clock,
        config=config.planner,
        observer=observer,
        log=log,
        owns=owns,
        gate=config.gate,
    )
    desired = DesiredState(
        config=config,
        boxes=boxes,
        profiles=profiles,
        agents=agents,
        health=health,
        book=book,
        drained=rollout.is_draining,
        served=ready.served,
        observed_demand=demand or dict,
        log=log,
    )
    loans = PrefixLoans(
        book=book,
        clock=clock,
        lend_seconds=config.precall_lend_seconds,
        protect_seconds=config.precall_protect_seconds,
        retry=config.planner.retry,
        log=log,
    )
    desired.overlay = loans.overlay
    evictions = EvictionReactions(
        book=book,
        epoch_of=lambda box_id: live.epoch if (live := health.live.get(box_id)) is not None else None,
        recheck=hooks.recheck_box,
        poke=hooks.poke,
        clock=clock,
        retry=config.planner.retry,
    )
    pacer = FleetPacer(
        clock=clock,
        budget=config.fleet_budget,
        box_limit=lambda box_id: config.planner.budget_for(box_id).max_concurrent,
        per_box_fallback=config.planner.budget.tokens_per_second,
        declared=lambda: [_declared_rate(profiles, box) for box in boxes.values()],
        observer=observer,
    )
    runner = ActionRunner(
        store=store,
        clock=clock,
        config=config,
        executor=executor or WarmExecutor(engine, clock),
        restart=restart or RestartWarmup(engine, store, clock),
        observer=observer,
        log=log,
        boxes=boxes,
        profiles=profiles,
        agents=agents,
        health=health,
        book=book,
        catalogue=catalogue,
        staging=staging,
        poke=hooks.poke,
        evictions=evictions,
        blocked=loans.blocks,
        pacer=pacer,
        values=desired.values,
    )
    promotion = PromptPromotion(
        store=store,
        clock=clock,
        config=config,
        agents=agents,
        profiles=profiles,
        staging=staging,
        catalogue=catalogue,
        book=book,
        live=health.live.get,
        routes_now=hooks.routes_now,
        log=log,
    )
    fleet = FleetEdits(
        store=store,
        boxes=boxes,
        profiles=profiles,
        lock=lock,
        health=health,
        book=book,
        runner=runner,
        desired=desired,
        rollout=rollout,
        notify_changed=hooks.notify_changed,
    )
    precall = PrecallWarming(
        clock=clock,
        config=config,
        boxes=boxes,
        agents=agents,
        activity=activity,
        catalogue=catalogue,
        desired=desired,
        health=health,
        book=book,
        runner=runner,
        rollout=rollout,
        routes_for=hooks.agent_routes,
        joining_routes_for=hooks.joining_routes,
        lent_routes_for=hooks.lent_routes,
        loans=loans,
        poke=hooks.poke,
        changed=hooks.changed,
        owns=owns,
    )
    side = SideRequests(
        clock=clock,
        boxes=boxes,
        health=health,
        book=book,
        desired=desired,
        runner=runner,
        answered_within=precall.answered_within,
        protect_seconds=config.precall_protect_seconds,
        call_hold_seconds=config.precall_call_hold_seconds,
        owns=owns,
        log=log,
    )
    replicas = ReplicaSync(
        gate=gate,
        clock=clock,
        store=store,
        boxes=boxes,
        profiles=profiles,
        rollout=rollout,
        health=health,
        book=book,
        runner=runner,
        fleet=fleet,
        on_fleet_change=on_fleet_change,
        notify_changed=hooks.notify_changed,
        poke=hooks.poke,
        log=log,
    )
    if gate is not None:
        book.trusted_since = replicas.trusted_since
    return Parts(
        book=book,
        rollout=rollout,
        health=health,
        activity=activity,
        catalogue=catalogue,
        staging=staging,
        ready=ready,
        desired=desired,
        runner=runner,
        promotion=promotion,
        fleet=fleet,
        precall=precall,
        side=side,
        replicas=replicas,
        evictions=evictions,
        loans=loans,
    )


def _declared_rate(profiles: Mapping[str, ModelProfile], box: BoxSpec) -> float | None:
    """The box's prefill rate as its model profile declares it (None: not declared)."""
    profile = profiles.get(box.model)
    return None if profile is None else profile.prefill_tokens_per_second
