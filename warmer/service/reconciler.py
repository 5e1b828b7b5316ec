"""The reconciler: a level-triggered loop that makes the engines hold what should be warm.

Every tick (on a timer from the root, or early on `poke()`):
1. poll health and epoch of every box, concurrently and bounded; a new epoch is written to the store (its
   older warm records are dropped: they died with the process) and the box leaves every route at once;
2. compute each agent's stable prefix once per spec version (recorded in the store);
3. build Desired (placement with move-before-switch handover) and Observed (store rows, warm-ups, the
   in-flight set, token buckets), call the pure `plan`, and carry the actions out: engine traffic as tasks
   bounded per box, every warm-state transition written with a reason so the database holds the history;
4. note boxes that became ready: time from health up to ready next to the engine time it took.

A missed event or a restart of the daemon only delays a fix by one tick: nothing here is edge-triggered
except the wake-up. On start, records verified before the daemon started are re-probed, not trusted.
Coalescing: one warm per (box, prefix) at a time; `ensure_warm` callers await the same in-flight future.

Around the loop: its config and value types are `warmer.service.reconcile_types`, staged prompts are
`warmer.service.prompt_staging`, the tokenizer drift check is `warmer.service.tokenizer_drift`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import structlog

from warmer.core.agents import AgentSpec
from warmer.core.campaigns import campaign_demand, merge_demand
from warmer.core.errors import ConfigError, StoreError, WarmerError
from warmer.core.model import (
    BoxCapacity,
    BoxSpec,
    Campaign,
    LoggedEvent,
    ModelProfile,
    PhaseName,
    PhaseRecord,
    Prefix,
    WarmRecord,
    WarmState,
)
from warmer.core.placement import (
    AgentDemand,
    PlacementConfig,
    fit_to_capacity,
    handover,
    place,
    stable_seed,
)
from warmer.core.plan_actions import (
    AbandonWarm,
    Action,
    MarkStale,
    ProbePrefix,
    Retire,
    RunRestartWarmup,
    WarmPrefix,
)
from warmer.core.planner import BoxObservation, Desired, Observed, PrefixRef, WarmKey, WarmupStatus, plan
from warmer.core.readiness import Route, agent_warmth, box_ready, routes
from warmer.core.warm_budget import TokenBucket, refill
from warmer.core.warmstate import (
    IllegalTransition,
    KeepaliveDue,
    ProbeCold,
    ProbeWarm,
    Released,
    WarmEvent,
    WarmFailed,
    WarmStarted,
    WarmVerified,
    is_serving,
    new_record,
    retry_at,
    transition,
)
from warmer.ports import Clock, EnginePort, StorePort
from warmer.service.prompt_staging import PromptStaging
from warmer.service.reconcile_types import (
    BoxLive,
    ComputedPrefix,
    EnsureResult,
    NullObserver,
    PendingPrompt,
    PrefixSource,
    ReadyReport,
    ReconcileObserver,
    ReconcilerConfig,
    Snapshot,
    UnknownAgent,
)
from warmer.service.restart import RestartOutcome, RestartWarmup
from warmer.service.tokenizer_drift import TokenizerDriftCheck
from warmer.service.warming import WarmExecutor, WarmOutcome

EVENT_BOX_READY = "box_ready"
EVENT_BOX_UNHEALTHY = "box_unhealthy"
EVENT_BOX_HEALTHY = "box_healthy"
EVENT_RESTART_WARMUP = "restart_warmup"


# A staged prompt (warmer.service.prompt_staging) became the agent's current one.
EVENT_PROMPT_CURRENT = "prompt_current"


def _group_key(config: PlacementConfig, demand: AgentDemand) -> tuple[int, bool]:
    """What of an agent's volume changes its placement: the group size it wants and dedication."""
    return config.wanted_group_size(demand), config.is_dedicated(demand)


def _ready_detail(report: ReadyReport) -> dict[str, object]:
    """The box_ready event's detail. A resumed report carries only its re-verification time: its engine
    figures cover just this daemon's probes, so an overhead computed from them would be meaningless."""
    if report.resumed:
        return {"resumed": True, "reverify_seconds": round(report.reverify_seconds, 6)}
    return {
        "time_to_ready_seconds": round(report.time_to_ready_seconds, 6),
        "engine_seconds": round(report.engine_seconds, 6),
        "warmup_engine_seconds": round(report.warmup_engine_seconds, 6),
        "prefix_engine_seconds": round(report.prefix_engine_seconds, 6),
        "overhead_fraction": round(report.overhead_fraction, 4),
    }


_Waiter = asyncio.Future[WarmRecord | None]


class Reconciler:
    """Keeps the fleet's caches matching the plan. `run(stopping)` is the root task; `poke()` wakes it."""

    def __init__(
        self,
        *,
        engine: EnginePort,
        store: StorePort,
        clock: Clock,
        boxes: Sequence[BoxSpec],
        profiles: Mapping[str, ModelProfile],
        agents: Mapping[str, AgentSpec],
        prefix_source: PrefixSource,
        config: ReconcilerConfig | None = None,
        executor: WarmExecutor | None = None,
        restart: RestartWarmup | None = None,
        observer: ReconcileObserver | None = None,
        demand: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self._engine = engine
        # Observed call volume per agent (calls/minute, e.g. pre-call asks); campaigns add theirs per tick.
        self._observed_demand = demand or dict
        self._store = store
        self._clock = clock
        self._boxes = {box.id: box for box in boxes}
        self._profiles = dict(profiles)
        self._agents = dict(agents)
        self._prefix_source = prefix_source
        self._config = config or ReconcilerConfig()
        self._executor = executor or WarmExecutor(engine, clock)
        self._restart = restart or RestartWarmup(engine, store, clock)
        self._observer: ReconcileObserver = observer or NullObserver()
        self._log = structlog.stdlib.get_logger(__name__)
        self._drift = TokenizerDriftCheck(
            store=store,
            observer=self._observer,
            log=self._log,
            threshold=self._config.tokenizer_drift_threshold,
        )

        self._live: dict[str, BoxLive] = {box_id: BoxLive() for box_id in self._boxes}
        self._records: dict[WarmKey, WarmRecord] = {}
        self._prefixes: dict[str, ComputedPrefix] = {}
        self._prefix_specs: dict[str, str] = {}  # agent -> spec hash its prefix was computed from
        self._prefix_errors: dict[str, str] = {}
        self._activity: dict[str, float] = {}
        self._precall: dict[str, float] = {}  # agent -> hold until (unix seconds)
        self._buckets: dict[str, TokenBucket] = {}
        self._in_flight: dict[tuple[str, str], _Waiter] = {}
        self._box_slots: dict[str, asyncio.Semaphore] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._routing: dict[str, tuple[str, ...]] = {}
        self._placement_key: object = None
        self._placement: Mapping[str, tuple[str, ...]] = {}
        self._desired: Desired | None = None
        self._trusted_after = 0.0
        self._started = False
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._ticks = 0
        # deploy events (warmer.service.deploy): staged prompts, rollout drains, rollout epoch tags
        self._staging = PromptStaging(store=store, prefix_source=prefix_source, log=self._log)
        self._drained: dict[str, str] = {}  # box id -> why it is out of service (rollout in progress)
        self._epoch_tags: dict[str, str] = {}  # box id -> tag making its epoch new after a rollout
        self._fleet_lock = asyncio.Lock()  # a box added/removed never lands in the middle of a tick
        self._suspect: set[str] = set()  # boxes whose hit rate dropped (hit-rate monitor): probe them
        # box id -> what its cache holds, as its engine reported it for its latest epoch (kept while the
        # box is down, so an outage does not reshuffle placement)
        self._capacity: dict[str, BoxCapacity] = {}
        # (box, epoch, prefix) -> the engine slot holding it, on engines with pinnable slots (llama.cpp):
        # a warm reserves a slot no other kept prefix of the box holds, and every later request of
        # warmer's for that prefix (keepalive, probe) and every pinned call runs there
        self._pins: dict[WarmKey, int] = {}
        self._served: set[str] = set()  # boxes that were ready at least once under this daemon
        # Health and epoch writes the in-memory view is already ahead of, oldest first: the view changes
        # at once (a restarted box leaves readiness even while the database is down) and these reach the
        # store, the durable truth, as soon as it answers (`_flush_unwritten`, every pass).
        self._unwritten: dict[tuple[object, ...], Callable[[], Awaitable[object]]] = {}

    # ------------------------------------------------------------------------------------------ lifecycle

    @property
    def ticks(self) -> int:
        return self._ticks

    async def start(self) -> None:
        """Register the fleet in the store; from now on, older verifications are re-probed before use."""
        if self._started:
            return
        await self._store.sync_boxes(list(self._boxes.values()))
        self._trusted_after = self._clock.now()
        self._started = True

    def poke(self) -> None:
        """Wake the loop for a tick as soon as it is free (several pokes coalesce into one tick)."""
        self._wake.set()

    async def run(self, stopping: asyncio.Event) -> None:
        """The root task: tick on every poke until `stopping` is set; in-flight work is then cancelled."""
        await self.start()
        stop_waiter = asyncio.ensure_future(stopping.wait())
        try:
            while not stopping.is_set():
                self._wake.clear()
                try:
                    await self.tick()
                except StoreError as exc:  # a database blip: say so, keep going, the next tick retries
                    self._log.error("reconcile tick failed", error=f"{type(exc).__name__}: {exc}")
                wake_waiter = asyncio.ensure_future(self._wake.wait())
                await asyncio.wait({wake_waiter, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
                wake_waiter.cancel()
        finally:
            stop_waiter.cancel()
            await self.close()

    async def close(self) -> None:
        """Cancel work in flight (a `warming` row left behind is abandoned by the next daemon's planner)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for waiter in self._in_flight.values():
            if not waiter.done():
                waiter.set_result(None)
        self._in_flight.clear()

    async def drain(self) -> None:
        """Wait until no action task is running (tests and benchmarks step the loop with this)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # ----------------------------------------------------------------------------------------------- tick

    async def tick(self) -> None:
        """One level-triggered pass: observe, plan, act (engine work continues as tasks)."""
        async with self._fleet_lock:
            await self._tick()

    async def _tick(self) -> None:
        await self.start()
        now = self._clock.now()
        await self._poll_boxes(now)
        await self._refresh_prefixes(now)
        await self._refresh_records()
        await self._staging.refresh(
            now, agents=self._agents, profiles=self._profiles, settle=self._settle_pending
        )
        campaigns = await self._store.list_campaigns()
        desired = self._build_desired(now, campaigns)
        self._desired = desired
        result = plan(
            self._staging.with_pending(desired, now),
            self._observed(for_routes=False),
            now,
            self._config.planner,
        )
        self._buckets = dict(result.buckets)
        await self._dispatch(result.actions)
        await self._note_readiness()
        self._ticks += 1
        self._notify_changed()

    async def wait_changed(self) -> None:
        """Return after the next pass (readiness and routes may have changed); gateway sync waits here."""
        await self._changed.wait()

    def ready_box_ids(self) -> set[str] | None:
        """Boxes ready now (the planner's `box_ready`); None before the first pass (not known yet)."""
        desired = self._desired
        if desired is None:
            return None
        observed, now = self._observed(for_routes=True), self._clock.now()
        return {b for b in self._boxes if box_ready(b, desired, observed, now, self._config.planner).ready}

    def set_suspect(self, box_id: str, suspect: bool) -> None:
        """The hit-rate monitor's verdict: a suspect box gets its warm prefixes probed (rate-limited)."""
        if box_id not in self._boxes:
            return
        if suspect:
            self._suspect.add(box_id)
        else:
            self._suspect.discard(box_id)
        self.poke()

    def _notify_changed(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # ----------------------------------------------------------------------------------------- observing

    async def _poll_boxes(self, now: float) -> None:
        limit = asyncio.Semaphore(self._config.health_concurrency)

        async def poll(box: BoxSpec) -> tuple[bool, str | None, str | None]:
            async with limit:
                return await self._poll(box)

        boxes = list(self._boxes.values())
        results = await asyncio.gather(*(poll(box) for box in boxes))
        for box, (healthy, epoch, error) in zip(boxes, results, strict=True):
            await self._apply_health(box, healthy, epoch, error, now)
        await self._flush_unwritten()  # a StoreError ends the pass; the view above already holds

    async def _poll(self, box: BoxSpec) -> tuple[bool, str | None, str | None]:
        """(healthy, epoch, why not) of one box, as its engine answers now."""
        try:
            if not await self._engine.health(box):
                return False, None, "health check failed"
            epoch = await self._engine.epoch(box)
            tag = self._epoch_tags.get(box.id)
            return True, (epoch if tag is None else f"{epoch}~{tag}"), None
        except WarmerError as exc:
            return False, None, str(exc)

    async def recheck_box(self, box_id: str) -> None:
        """Look at one box now, between polls: a caller retrying a call it was given this box for has met
        trouble there (a restart is over sooner than a poll interval), so a new process must not be
        answered as the warm old one. A changed epoch or a box down leaves the routes before the answer."""
        box = self._boxes.get(box_id)
        if box is None:
            return
        healthy, epoch, error = await self._poll(box)
        live = self._live.get(box_id)
        if live is not None and healthy == live.healthy and epoch == live.epoch:
            return  # nothing changed: no pass needed
        async with self._fleet_lock:
            await self._apply_health(box, healthy, epoch, error, self._clock.now())
            try:
                await self._flush_unwritten()
            except StoreError as exc:  # the answer comes from the view; the next pass writes it
                self._log.warning("box health not stored yet", box=box_id, error=str(exc))
        self._notify_changed()
        self.poke()

    async def _apply_health(
        self, box: BoxSpec, healthy: bool, epoch: str | None, error: str | None, now: float
    ) -> None:
        """Change the in-memory view first, then queue its store writes: what the daemon sees of a box
        must take it out of readiness at once, whether or not the database answers."""
        live = self._live.get(box.id)
        if live is None:
            return  # removed from the fleet while it was being polled
        if not healthy or epoch is None:
            if live.healthy:
                self._log.warning("box unhealthy: out of every route", box=box.id, error=error)
                event = LoggedEvent(
                    at=now, kind=EVENT_BOX_UNHEALTHY, box_id=box.id, epoch=live.epoch, detail={"error": error}
                )
                self._event_later(event)
            live.healthy, live.health_error = False, error
            return
        if epoch != live.epoch:
            # A new process holds nothing of the old one's: its records and pins go, it starts cold.
            self._records = {k: r for k, r in self._records.items() if k[0] != box.id or k[1] == epoch}
            self._pins = {k: s for k, s in self._pins.items() if k[0] != box.id or k[1] == epoch}
            fresh = BoxLive(
                healthy=True, epoch=epoch, healthy_since=now, healthy_since_mono=self._clock.monotonic()
            )
            self._live[box.id] = fresh
            self._log.info("box epoch", box=box.id, epoch=epoch, previous=live.epoch)
            key = (box.id, "epoch", epoch)
            self._unwritten.pop(key, None)  # back to an epoch still queued: it is now the newest write
            self._write_later(key, functools.partial(self._store_epoch, box.id, epoch, now, new=True))
            await self._read_capacity(box)
            try:
                await self._flush_unwritten()
                await self._resume_warmup(box.id, epoch, fresh)
            except StoreError as exc:  # cold until a pass can read the store: never warm by default
                self._log.warning("box epoch not stored yet", box=box.id, epoch=epoch, error=str(exc))
            return
        self._write_later((box.id, "epoch", epoch), functools.partial(self._store_epoch, box.id, epoch, now))
        if not live.healthy:
            event = LoggedEvent(at=now, kind=EVENT_BOX_HEALTHY, box_id=box.id, epoch=epoch)
            self._event_later(event)
        live.healthy, live.health_error = True, None

    def _write_later(self, key: tuple[object, ...], write: Callable[[], Awaitable[object]]) -> None:
        """Queue a store write behind the ones already waiting (one per `key`, (box id, what, ...): the
        first one queued)."""
        self._unwritten.setdefault(key, write)

    def _event_later(self, event: LoggedEvent) -> None:
        self._write_later(
            (event.box_id, "event", event.kind, event.at), functools.partial(self._store.append_event, event)
        )

    async def _flush_unwritten(self) -> None:
        """Write what the view is ahead of, oldest first; each leaves the queue once written, so a
        StoreError (raised) keeps it and the rest for the next try."""
        while self._unwritten:
            key, write = next(iter(self._unwritten.items()))
            await write()
            del self._unwritten[key]

    async def _store_epoch(self, box_id: str, epoch: str, at: float, *, new: bool = False) -> None:
        """The box's epoch in the store; a new one also drops the box's records of every other epoch
        (they died with their process). Safe to repeat after a failure part way."""
        changed = await self._store.record_epoch(box_id, epoch, at)
        if new:
            dropped = await self._store.drop_other_epochs(box_id, epoch)
            self._log.info("box epoch stored", box=box_id, epoch=epoch, new=changed, dropped_records=dropped)

    async def _read_capacity(self, box: BoxSpec) -> None:
        """What the new process's cache holds (placement never gives a box more prefixes than that)."""
        try:
            capacity = await self._engine.capacity(box)
        except WarmerError as exc:
            self._log.warning("box capacity unknown", box=box.id, error=str(exc))
            return
        if self._capacity.get(box.id) != capacity:
            self._log.info(
                "box capacity",
                box=box.id,
                prefixes=capacity.prefixes,
                tokens=capacity.tokens,
                source=capacity.source,
            )
        self._capacity[box.id] = capacity

    def _eligible_boxes(self) -> frozenset[str]:
        """Boxes placement may give agents to: up, not being drained for a rollout, and not in the restart
        warm-up of a new process after having served (a restart is over in a second on some engines, far
        sooner than its warm-up). Such a box hands its agents to the rest of the fleet at once, warmed there
        before traffic moves; they come back once it is warmed up, since rendezvous ranks are fixed. Boxes
        on their first warm-up under this daemon stay eligible, so a fleet starting together is placed once,
        not reshuffled box by box as each finishes."""
        return frozenset(
            box_id
            for box_id, live in self._live.items()
            if live.healthy
            and live.epoch is not None
            and box_id not in self._drained
            and (live.warmup is WarmupStatus.DONE or box_id not in self._served)
        )

    def _placement_boxes(self) -> list[BoxSpec]:
        """The fleet as placement sees it: configured limits, else the engine's own capacity figures."""
        return [
            self._capacity[box_id].applied_to(box) if box_id in self._capacity else box
            for box_id, box in self._boxes.items()
        ]

    async def _resume_warmup(self, box_id: str, epoch: str, live: BoxLive) -> None:
        """The restart warm-up of an epoch already seen (daemon restarted while the engine kept running)
        counts as done only when its PREFIXES phase was reached; a failed phase waits for its retry."""
        phases = await self._store.list_phases(box_id, epoch)
        failed = [p for p in phases if p.ok is False]
        if failed:
            live.warmup = WarmupStatus.FAILED
            live.warmup_finished_at = max(p.finished_at or p.started_at for p in failed)
            live.warmup_error = failed[-1].error
        elif prefixes := [p for p in phases if p.phase is PhaseName.PREFIXES]:
            live.warmup = WarmupStatus.DONE
            live.warmup_finished_at = max(p.started_at for p in prefixes)
            live.resumed = True
            if all(p.finished_at is None for p in prefixes):
                # The previous daemon died mid-phase: this one finishes its row. A finished row is history
                # this daemon must not overwrite with the timings of its re-verification probes.
                live.prefixes_started_at = live.warmup_finished_at

    async def _refresh_prefixes(self, now: float) -> None:
        for agent_id, spec in self._agents.items():
            if self._prefix_specs.get(agent_id) == spec.spec_hash:
                continue
            profile = self._profiles.get(spec.model)
            if profile is None:
                self._prefix_errors[agent_id] = f"unknown model profile {spec.model!r}"
                continue
            try:
                computed = await self._prefix_source(spec, profile)
                await self._store.record_prefix(
                    agent_id, spec.spec_hash, computed.prefix, engine_version=computed.engine_version, at=now
                )
                await self._drift.check(agent_id, spec, computed, now)
            except WarmerError as exc:
                if self._prefix_errors.get(agent_id) != str(exc):
                    self._log.error(
                        "cannot compute the agent's stable prefix", agent=agent_id, error=str(exc)
                    )
                self._prefix_errors[agent_id] = str(exc)
                continue
            self._prefixes[agent_id] = computed
            self._prefix_specs[agent_id] = spec.spec_hash
            self._prefix_errors.pop(agent_id, None)
            self._activity.setdefault(agent_id, now)  # a new agent is warmed before its first call

    async def _refresh_records(self) -> None:
        """The store is the truth: reload the current epochs' rows (a replica or an operator may write)."""
        current = {box_id: live.epoch for box_id, live in self._live.items() if live.epoch is not None}
        rows = await self._store.list_warm()
        loaded = {(r.box_id, r.epoch, r.prefix_hash): r for r in rows if current.get(r.box_id) == r.epoch}
        # A warm or probe of this daemon may have finished while the rows were being read: its newer
        # transition (already written) wins over the older row the read returned, so a just-verified
        # prefix is not probed or warmed again on stale evidence.
        for key, mine in self._records.items():
            row = loaded.get(key)
            if (row is None and (key[0], key[2]) in self._in_flight) or (
                row is not None and mine.updated_at > row.updated_at
            ):
                loaded[key] = mine
        self._records = loaded

    def _build_desired(self, now: float, campaigns: Sequence[Campaign]) -> Desired:
        refs = {a: PrefixRef(c.prefix.hash, c.prefix.token_count) for a, c in self._prefixes.items()}
        volume = merge_demand(
            campaign_demand(campaigns, now, self._config.planner.campaign_lead_seconds),
            self._observed_demand(),
        )
        target = self._place(refs, volume)
        warm = {(r.box_id, r.prefix_hash) for r in self._trusted_records().values() if is_serving(r)}
        prefix_of = {agent: ref.hash for agent, ref in refs.items()}
        moving = handover(self._routing, target, prefix_of, warm, existing=self._boxes.keys())
        moving = fit_to_capacity(
            moving, target, prefix_of, {b.id: b for b in self._placement_boxes()}, volume
        )
        self._routing = dict(moving.routing)
        self._precall = {agent: until for agent, until in self._precall.items() if until > now}
        return Desired(
            boxes=self._boxes,
            profiles=self._profiles,
            agents=refs,
            assignment=moving.keep_warm,
            routing=moving.routing,
            campaigns=tuple(campaigns),
            precall=frozenset(self._precall),
            last_activity=dict(self._activity),
        )

    def _place(
        self, refs: Mapping[str, PrefixRef], volume: Mapping[str, float] | None = None
    ) -> Mapping[str, tuple[str, ...]]:
        """Placement is recomputed only when the fleet, a prefix or an agent's wanted group size changes
        (it is stable, but not free). `volume` (calls/minute: campaigns, pre-call asks) widens groups."""
        volume = volume or {}
        config = self._config.placement
        demands = [
            AgentDemand(
                agent,
                self._agents[agent].model,
                ref.tokens,
                calls_per_minute=volume.get(agent, 0.0),
                prefix_hash=ref.hash,
            )
            for agent, ref in sorted(refs.items())
        ]
        boxes = self._placement_boxes()
        eligible = self._eligible_boxes()
        key = (
            tuple(sorted((b.id, b.prefix_capacity, b.cache_capacity_tokens) for b in boxes)),
            tuple(sorted(eligible)),
            tuple((d.agent_id, d.prefix_hash, d.prefix_tokens, _group_key(config, d)) for d in demands),
        )
        if key != self._placement_key:
            placement = place(
                boxes, demands, self._config.placement, eligible=eligible, previous=self._routing
            )
            for agent, why in placement.unplaced.items():
                self._log.warning("agent not placed", agent=agent, reason=str(why))
            self._placement, self._placement_key = placement.groups, key
        return self._placement

    def _trusted_records(self) -> dict[WarmKey, WarmRecord]:
        """Records that count as warm for routing: a verification from before this daemon started does
        not, until a probe renews it."""
        return {
            key: record
            for key, record in self._records.items()
            if record.state not in (WarmState.WARM, WarmState.STALE)
            or (record.verified_at is not None and record.verified_at >= self._trusted_after)
        }

    def _observed(self, *, for_routes: bool) -> Observed:
        return Observed(
            boxes={
                box_id: BoxObservation(
                    healthy=live.healthy,
                    epoch=live.epoch,
                    warmup=live.warmup,
                    warmup_finished_at=live.warmup_finished_at,
                    draining=box_id in self._drained,
                )
                for box_id, live in self._live.items()
            },
            warm=self._trusted_records() if for_routes else dict(self._records),
            in_flight=frozenset(self._in_flight),
            buckets=dict(self._buckets),
            suspect_boxes=frozenset(self._suspect),
            trusted_after=self._trusted_after,
        )

    # ------------------------------------------------------------------------------------------- acting

    async def _dispatch(self, actions: Sequence[Action]) -> None:
        for action in actions:
            if isinstance(action, RunRestartWarmup):
                self._start_restart(action)
            elif isinstance(action, MarkStale):
                await self._apply(
                    action.box_id, action.epoch, action.prefix_hash, KeepaliveDue(), "keepalive due"
                )
            elif isinstance(action, Retire):
                await self._apply(
                    action.box_id, action.epoch, action.prefix_hash, Released(action.reason), action.reason
                )
            elif isinstance(action, AbandonWarm):
                await self._apply(
                    action.box_id, action.epoch, action.prefix_hash, WarmFailed(action.reason), action.reason
                )
            elif isinstance(action, WarmPrefix):
                self._start_engine_work(
                    action.box_id, action.epoch, action.prefix_hash, str(action.reason), probe=False
                )
            elif isinstance(action, ProbePrefix):
                self._start_engine_work(
                    action.box_id, action.epoch, action.prefix_hash, str(action.reason), probe=True
                )

    async def _apply(self, box_id: str, epoch: str, prefix_hash: str, event: WarmEvent, reason: str) -> None:
        """A bookkeeping transition (no engine request), written with its reason."""
        key = (box_id, epoch, prefix_hash)
        record = self._records.get(key)
        if record is None:
            return
        try:
            updated = transition(record, event, self._clock.now(), self._config.planner.retry)
        except IllegalTransition as exc:
            self._log.warning("skipped a transition the record no longer allows", error=str(exc))
            return
        await self._store.put_warm(updated, reason=reason, previous=record.state)
        self._records[key] = updated
        if not is_serving(updated) and updated.state is not WarmState.WARMING:
            self._pins.pop(key, None)

    def _pin_for(self, key: WarmKey) -> int | None:
        """The slot for a warm of `key`: the one it holds, else a slot no other kept prefix of the box holds
        (reserved now, so two warms in flight never pick the same), else none (the engine chooses)."""
        if key in self._pins:
            return self._pins[key]
        capacity = self._capacity.get(key[0])
        if capacity is None or not capacity.pinnable_slots:
            return None
        taken = {slot for (b, e, _), slot in self._pins.items() if b == key[0] and e == key[1]}
        free = [slot for slot in range(capacity.pinnable_slots) if slot not in taken]
        if not free:
            return None
        self._pins[key] = free[0]
        return free[0]

    def prefix_slot(self, agent_id: str, box_id: str) -> int | None:
        """The engine slot holding the agent's current prefix on the box, when pinned (llama.cpp): a call
        that names it (`id_slot`) waits for its own slot instead of evicting another agent's prompt."""
        computed = self._prefixes.get(agent_id)
        live = self._live.get(box_id)
        if computed is None or live is None or live.epoch is None:
            return None
        key = (box_id, live.epoch, computed.prefix.hash)
        record = self._records.get(key)
        if record is None or not is_serving(record):
            return None
        return self._pins.get(key)

    def _spawn(self, work: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(work)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _slots(self, box_id: str) -> asyncio.Semaphore:
        """The per-box warm budget's concurrency: warms, probes and pre-call warms all pass through it."""
        semaphore = self._box_slots.get(box_id)
        if semaphore is None:
            limit = self._config.planner.budget_for(box_id).max_concurrent
            semaphore = self._box_slots[box_id] = asyncio.Semaphore(limit)
        return semaphore

    def _start_restart(self, action: RunRestartWarmup) -> None:
        live = self._live[action.box_id]
        live.warmup = WarmupStatus.RUNNING
        live.warmup_error = None
        self._spawn(self._restart_task(action), f"restart-warmup:{action.box_id}")

    async def _restart_task(self, action: RunRestartWarmup) -> None:
        box = self._boxes[action.box_id]
        profile = self._profiles[box.model]
        outcome: RestartOutcome | None = None
        error: str | None = None
        try:
            outcome = await self._restart.run(
                box, profile, action.epoch, longest_prefix=self._longest_prefix(box.model)
            )
            error = outcome.error
        except WarmerError as exc:
            error = f"{type(exc).__name__}: {exc}"
        now = self._clock.now()
        live = self._live[action.box_id]
        try:
            if live.epoch != action.epoch:
                return  # the process changed under the warm-up: the new epoch gets its own
            for phase in outcome.phases if outcome is not None else ():
                seconds = (phase.finished_at or phase.started_at) - phase.started_at
                self._observer.phase_finished(box.id, phase.phase.value, bool(phase.ok), seconds)
            detail: dict[str, object] = {"ok": error is None, "error": error}
            if outcome is not None:
                detail |= {
                    "wall_seconds": round(outcome.wall_seconds, 6),
                    "engine_seconds": round(outcome.engine_seconds, 6),
                    "critical_engine_seconds": round(outcome.critical_engine_seconds, 6),
                }
            await self._store.append_event(
                LoggedEvent(
                    at=now, kind=EVENT_RESTART_WARMUP, box_id=box.id, epoch=action.epoch, detail=detail
                )
            )
            live.warmup_finished_at = now
            if error is not None or outcome is None:
                live.warmup, live.warmup_error = WarmupStatus.FAILED, error
                self._log.warning("restart warm-up failed", box=box.id, epoch=action.epoch, error=error)
                return
            live.warmup_engine_seconds = outcome.critical_engine_seconds
            live.warmup_wall_seconds = outcome.wall_seconds
            await self._store.put_phase(
                PhaseRecord(box_id=box.id, epoch=action.epoch, phase=PhaseName.PREFIXES, started_at=now)
            )
            live.prefixes_started_at = now
            live.warmup = WarmupStatus.DONE
            self._log.info(
                "restart warm-up done",
                box=box.id,
                epoch=action.epoch,
                wall_seconds=round(outcome.wall_seconds, 3),
                engine_seconds=round(outcome.critical_engine_seconds, 3),
            )
        except WarmerError as exc:
            live.warmup, live.warmup_error, live.warmup_finished_at = WarmupStatus.FAILED, str(exc), now
        finally:
            self.poke()

    def _start_engine_work(
        self, box_id: str, epoch: str, prefix_hash: str, reason: str, *, probe: bool
    ) -> _Waiter:
        """Send one warm (or probe) of (box, prefix) unless one is in flight; return the future to await."""
        key = (box_id, prefix_hash)
        waiter = self._in_flight.get(key)
        if waiter is not None:
            return waiter
        waiter = asyncio.get_running_loop().create_future()
        self._in_flight[key] = waiter
        work = (
            self._probe(box_id, epoch, prefix_hash, reason)
            if probe
            else self._warm(box_id, epoch, prefix_hash, reason)
        )
        self._spawn(
            self._engine_task(key, waiter, work), f"{'probe' if probe else 'warm'}:{box_id}:{prefix_hash}"
        )
        return waiter

    async def _engine_task(
        self, key: tuple[str, str], waiter: _Waiter, work: Awaitable[WarmRecord | None]
    ) -> None:
        result: WarmRecord | None = None
        try:
            async with self._slots(key[0]):
                result = await work
        except WarmerError as exc:
            self._log.error(
                "warm work failed", box=key[0], prefix=key[1], error=f"{type(exc).__name__}: {exc}"
            )
        finally:
            if self._in_flight.get(key) is waiter:
                del self._in_flight[key]
            if not waiter.done():
                waiter.set_result(result)
            self.poke()

    def _longest_prefix(self, model: str) -> int | None:
        """The longest current stable prefix among the agents of `model` (sizes the restart long prefill)."""
        sizes = [
            computed.prefix.token_count
            for agent_id, computed in self._prefixes.items()
            if self._agents[agent_id].model == model
        ]
        return max(sizes, default=None)

    def _prefix_of(self, prefix_hash: str) -> Prefix | None:
        for computed in self._prefixes.values():
            if computed.prefix.hash == prefix_hash:
                return computed.prefix
        return self._staging.prefix(prefix_hash)

    async def _warm(self, box_id: str, epoch: str, prefix_hash: str, reason: str) -> WarmRecord | None:
        box, prefix = self._boxes[box_id], self._prefix_of(prefix_hash)
        if prefix is None or self._live[box_id].epoch != epoch:
            return None
        profile = self._profiles[box.model]
        key = (box_id, epoch, prefix_hash)
        now = self._clock.now()
        record = self._records.get(key)
        before = (
            record if record is not None else new_record(box_id, epoch, prefix_hash, prefix.token_count, now)
        )
        try:
            started = transition(before, WarmStarted(), now, self._config.planner.retry)
        except IllegalTransition:
            return before  # already warm, warming elsewhere, or failed within its backoff: nothing to send
        await self._store.put_warm(
            started, reason=f"warm started: {reason}", previous=record.state if record is not None else None
        )
        self._records[key] = started
        outcome = await self._executor.warm_and_verify(box, profile, prefix, slot=self._pin_for(key))
        return await self._finish(key, started, outcome, kind="warm", reason=reason)

    async def _probe(self, box_id: str, epoch: str, prefix_hash: str, reason: str) -> WarmRecord | None:
        box, prefix = self._boxes[box_id], self._prefix_of(prefix_hash)
        key = (box_id, epoch, prefix_hash)
        record = self._records.get(key)
        if prefix is None or record is None or self._live[box_id].epoch != epoch:
            return None
        outcome = await self._executor.probe(box, self._profiles[box.model], prefix, slot=self._pins.get(key))
        return await self._finish(key, record, outcome, kind="probe", reason=reason)

    async def _finish(
        self, key: WarmKey, record: WarmRecord, outcome: WarmOutcome, *, kind: str, reason: str
    ) -> WarmRecord | None:
        box_id, epoch, _ = key
        live = self._live[box_id]
        if live.epoch != epoch:
            self._log.info("epoch changed during a warm: result dropped", box=box_id, epoch=epoch)
            return None
        live.prefix_engine_seconds += outcome.engine_seconds or 0.0
        live.prefix_requests += outcome.requests_sent
        now = self._clock.now()
        cached = outcome.cached_tokens if outcome.cached_tokens is not None else 0
        event: WarmEvent
        if kind == "warm":
            if outcome.verified:
                record = replace(record, prefix_tokens=outcome.prefix_tokens)  # the engine's own count
                event = WarmVerified(cached, outcome.block_tokens)
                why = f"verified ({reason}): cached {cached} of {outcome.prefix_tokens} tokens"
            else:
                event = WarmFailed(outcome.reason or "not verified")
                why = f"warm failed ({reason}): {outcome.reason}"
        elif outcome.verified:
            event = ProbeWarm(cached, outcome.block_tokens)
            why = f"probe ({reason}) saw the hit: cached {cached} of {outcome.prefix_tokens} tokens"
        else:
            event = ProbeCold(outcome.cached_tokens)
            why = f"probe ({reason}) says cold: {outcome.reason}"
        try:
            updated = transition(record, event, now, self._config.planner.retry)
        except IllegalTransition as exc:
            self._log.warning("warm result no longer applies", error=str(exc))
            return record
        await self._store.put_warm(updated, reason=why, previous=record.state)
        self._records[key] = updated
        if outcome.verified and outcome.slot is not None:
            self._pins[key] = outcome.slot
        elif not outcome.verified:
            self._pins.pop(key, None)
        verdict = "verified" if outcome.verified else ("cold" if kind == "probe" else "failed")
        self._observer.warm_finished(box_id, kind, reason, verdict, outcome.wall_seconds)
        self._observer.warm_tokens(box_id, outcome.prefix_tokens * outcome.requests_sent)
        if not outcome.verified:
            self._log.warning(f"{kind} not verified", box=box_id, prefix=key[2], reason=outcome.reason)
        return updated

    # --------------------------------------------------------------------------------------- readiness

    async def _note_readiness(self) -> None:
        """Record, once per epoch (per daemon: a resumed epoch is recorded as such), the moment a box
        became ready and what that took."""
        desired = self._desired
        if desired is None:
            return
        now = self._clock.now()
        observed = self._observed(for_routes=True)
        ready_boxes = 0
        ready_by_box: dict[str, bool] = {}
        for box_id, live in self._live.items():
            readiness = box_ready(box_id, desired, observed, now, self._config.planner)
            ready_boxes += readiness.ready
            ready_by_box[box_id] = readiness.ready
            if not readiness.ready or live.ready_report is not None or live.epoch is None:
                continue
            since_mono = (
                live.healthy_since_mono if live.healthy_since_mono is not None else self._clock.monotonic()
            )
            report = ReadyReport(
                box_id=box_id,
                epoch=live.epoch,
                at=now,
                time_to_ready_seconds=max(0.0, self._clock.monotonic() - since_mono),
                warmup_engine_seconds=live.warmup_engine_seconds,
                prefix_engine_seconds=live.prefix_engine_seconds,
                warmup_wall_seconds=live.warmup_wall_seconds,
                resumed=live.resumed,
            )
            live.ready_report = report
            self._served.add(box_id)
            if live.prefixes_started_at is not None:  # None: an earlier daemon finished this epoch's phase
                await self._store.put_phase(
                    PhaseRecord(
                        box_id=box_id,
                        epoch=live.epoch,
                        phase=PhaseName.PREFIXES,
                        started_at=live.prefixes_started_at,
                        finished_at=now,
                        engine_seconds=live.prefix_engine_seconds,
                        requests=live.prefix_requests,
                        ok=True,
                    )
                )
            await self._store.append_event(
                LoggedEvent(
                    at=now,
                    kind=EVENT_BOX_READY,
                    box_id=box_id,
                    epoch=live.epoch,
                    detail=_ready_detail(report),
                )
            )
            if report.resumed:
                # Not a time to ready: this daemon did not see the epoch start. Observing it would put a
                # restart-of-the-daemon figure (~0 engine seconds) into the time-to-ready statistics.
                self._log.info(
                    "box ready (resumed)",
                    box=box_id,
                    epoch=live.epoch,
                    reverify_seconds=round(report.reverify_seconds, 3),
                )
                continue
            self._observer.box_ready(box_id, report.time_to_ready_seconds, report.engine_seconds)
            self._log.info(
                "box ready",
                box=box_id,
                epoch=live.epoch,
                time_to_ready_seconds=round(report.time_to_ready_seconds, 3),
                engine_seconds=round(report.engine_seconds, 3),
                overhead=f"{report.overhead_fraction:.1%}",
            )
        warm = sum(1 for r in observed.warm.values() if is_serving(r))
        self._observer.fleet_state(ready_boxes, warm)
        self._observer.box_states(ready_by_box, agent_warmth(desired, observed))

    # ------------------------------------------------------------------------------------------- views

    def snapshot(self) -> Snapshot:
        return Snapshot(
            now=self._clock.now(),
            boxes=dict(self._boxes),
            live={box_id: dataclasses.replace(live) for box_id, live in self._live.items()},
            desired=self._desired,
            observed=self._observed(for_routes=True),
            records=dict(self._records),
            prefixes=dict(self._prefixes),
            prefix_errors=dict(self._prefix_errors),
            config=self._config.planner,
        )

    def touch(self, agent_id: str) -> None:
        """Traffic for the agent: keep its prefix warm (idle agents stop being kept warm)."""
        self._activity[agent_id] = self._clock.now()

    # ------------------------------------------------------------------------------------ deploy events

    def agent_routes(self, agent_id: str) -> tuple[Route, ...]:
        """The agent's current routes (what `snapshot().routes()` holds for it), computed for it alone."""
        desired = self._desired
        if desired is None:
            return ()
        observed = self._observed(for_routes=True)
        found = routes(desired, observed, self._clock.now(), self._config.planner, only=(agent_id,))
        return found.get(agent_id, ())

    def fleet(self) -> Mapping[str, BoxSpec]:
        """The boxes this reconciler may call now (config plus runtime `box.added`)."""
        return dict(self._boxes)

    def agent_specs(self) -> Mapping[str, AgentSpec]:
        return dict(self._agents)

    def profile_names(self) -> frozenset[str]:
        return frozenset(self._profiles)

    def pending_prompts(self) -> Mapping[str, PendingPrompt]:
        return self._staging.pending()

    def draining(self) -> Mapping[str, str]:
        """Boxes taken out of service by a rollout, with why."""
        return dict(self._drained)

    def stage_prompt(self, spec: AgentSpec) -> None:
        """Warm `spec`'s prefix beside the current one; it becomes current once warm where the agent is
        routed (or at once when the agent has no warm route). A newer staged spec replaces an older one."""
        if spec.id not in self._agents:
            raise UnknownAgent(spec.id)
        if spec.model not in self._profiles:
            raise ConfigError([("spec.model", f"unknown model profile {spec.model!r}")])
        self._staging.stage(spec, self._clock.now())
        self.poke()

    def drain_boxes(self, box_ids: Sequence[str], reason: str) -> None:
        """A rollout will restart these boxes: hand their agents to the rest of the fleet first.

        The boxes leave placement at once, so their agents are warmed on other boxes; move-before-switch
        keeps routing calls to a draining box until the agent is warm elsewhere, so no call meets a cold
        box while a warm one exists. A box is drained (`drained_boxes`) once no route uses it; it leaves
        every route at once when it goes down."""
        unknown = [box_id for box_id in box_ids if box_id not in self._boxes]
        if unknown:
            raise ConfigError([("box_ids", f"unknown boxes: {', '.join(unknown)}")])
        for box_id in box_ids:
            self._drained[box_id] = reason
        self._notify_changed()
        self.poke()

    def drained_boxes(self) -> frozenset[str]:
        """Draining boxes that no route uses any more: safe to restart without a call meeting them."""
        routed = {box_id for group in self._routing.values() for box_id in group}
        return frozenset(box_id for box_id in self._drained if box_id not in routed)

    def undrain_boxes(self, box_ids: Sequence[str], epoch_tag: str) -> None:
        """Back in service as a NEW epoch (`<engine epoch>~<tag>`), even when the engine's own identity did
        not change: restart warm-up, then the prefixes, then the routes."""
        unknown = [box_id for box_id in box_ids if box_id not in self._boxes]
        if unknown:
            raise ConfigError([("box_ids", f"unknown boxes: {', '.join(unknown)}")])
        for box_id in box_ids:
            self._drained.pop(box_id, None)
            self._epoch_tags[box_id] = epoch_tag
        self.poke()

    async def add_box(self, box: BoxSpec) -> None:
        """A new box joins the fleet (registered in the store); it is warmed before any route uses it."""
        async with self._fleet_lock:
            if box.id in self._boxes:
                raise ConfigError([("box.id", f"box {box.id!r} is already registered")])
            if box.model not in self._profiles:
                raise ConfigError([("box.model", f"unknown model profile {box.model!r}")])
            self._boxes[box.id] = box
            self._live[box.id] = BoxLive()
            await self._store.sync_boxes(list(self._boxes.values()))
        self.poke()

    async def remove_box(self, box_id: str) -> None:
        """A box leaves the fleet: out of routes at once, its engine work cancelled, its rows dropped
        (the event log keeps its history)."""
        async with self._fleet_lock:
            if box_id not in self._boxes:
                raise ConfigError([("box_id", f"unknown box {box_id!r}")])
            mine = [
                t for t in self._tasks if t.get_name().endswith(f":{box_id}") or f":{box_id}:" in t.get_name()
            ]
            for task in mine:
                task.cancel()
            await asyncio.gather(*mine, return_exceptions=True)
            del self._boxes[box_id]
            self._capacity.pop(box_id, None)
            self._live.pop(box_id, None)
            self._drained.pop(box_id, None)
            self._epoch_tags.pop(box_id, None)
            self._records = {k: r for k, r in self._records.items() if k[0] != box_id}
            self._pins = {k: s for k, s in self._pins.items() if k[0] != box_id}
            # its epoch rows go with its box row; a queued epoch write would now fail on every pass
            self._unwritten = {k: w for k, w in self._unwritten.items() if k[:2] != (box_id, "epoch")}
            self._routing = {a: tuple(b for b in group if b != box_id) for a, group in self._routing.items()}
            if self._desired is not None:
                desired = self._desired
                self._desired = replace(
                    desired,
                    boxes=dict(self._boxes),
                    assignment={a: tuple(b for b in g if b != box_id) for a, g in desired.assignment.items()},
                    routing=dict(self._routing),
                )
            await self._store.sync_boxes(list(self._boxes.values()))
        self._notify_changed()
        self.poke()

    async def _settle_pending(self, agent_id: str, pending: PendingPrompt, now: float) -> None:
        """Make a staged prompt whose prefix is computed current once `_pending_done` says why it may."""
        why = self._pending_done(agent_id, pending, now)
        if why is not None:
            await self._promote(agent_id, pending, why, now)

    def _pending_done(self, agent_id: str, pending: PendingPrompt, now: float) -> str | None:
        """Why the staged prompt may become current now, or None to keep warming it."""
        computed = pending.computed
        if computed is None:
            return None
        current = self._prefixes.get(agent_id)
        if current is None:
            return "the agent had no current prefix"
        if current.prefix.hash == computed.prefix.hash:
            return "same stable prefix"
        if pending.spec.model != self._agents[agent_id].model:
            return "model changed: the agent's old boxes cannot serve it"
        if now - pending.staged_at >= self._config.pending_prompt_timeout_seconds:
            return "timed out: made current without being warm on every routed box"
        if self._desired is None:
            return None
        serving = routes(self._desired, self._observed(for_routes=True), now, self._config.planner)
        routed = serving.get(agent_id, ())
        if not routed:
            return "the agent had no warm route"
        trusted = self._trusted_records()
        for route in routed:
            live = self._live.get(route.box_id)
            record = trusted.get((route.box_id, live.epoch or "", computed.prefix.hash)) if live else None
            if record is None or not is_serving(record) or record.warmed_at is None:
                return None
        return "verified warm on every routed box"

    async def _promote(self, agent_id: str, pending: PendingPrompt, why: str, now: float) -> None:
        computed = pending.computed
        assert computed is not None
        spec = pending.spec
        old = self._prefixes.get(agent_id)
        await self._store.record_prefix(
            agent_id, spec.spec_hash, computed.prefix, engine_version=computed.engine_version, at=now
        )
        await self._drift.check(agent_id, spec, computed, now)
        self._agents[agent_id] = spec
        self._prefixes[agent_id] = computed
        self._prefix_specs[agent_id] = spec.spec_hash
        self._prefix_errors.pop(agent_id, None)
        self._activity.setdefault(agent_id, now)
        self._staging.discard(agent_id, pending)
        self._log.info("staged prompt is current", agent=agent_id, prefix=computed.prefix.hash, reason=why)
        await self._store.append_event(
            LoggedEvent(
                at=now,
                kind=EVENT_PROMPT_CURRENT,
                agent_id=agent_id,
                prefix_hash=computed.prefix.hash,
                detail={
                    "spec_hash": spec.spec_hash,
                    "previous_prefix": old.prefix.hash if old is not None else None,
                    "reason": why,
                },
            )
        )

    # --------------------------------------------------------------------------------------- pre-call

    async def ensure_warm(self, agent_id: str, wait_seconds: float = 0.0) -> EnsureResult:
        """The box a call for `agent_id` should use, warming the agent's prefix there if needed.

        Returns at once when a route exists; otherwise starts (or joins: coalesced) the warm on the agent's
        best box and waits up to `wait_seconds` for it to be verified and routed.
        """
        if agent_id not in self._agents:
            raise UnknownAgent(agent_id)
        now = self._clock.now()
        self._activity[agent_id] = now
        self._precall[agent_id] = now + self._config.precall_hold_seconds
        deadline = self._clock.monotonic() + max(0.0, wait_seconds)
        woken = False
        while True:
            result, waiter = self._ensure_step(agent_id)
            if result.routed:
                return result  # warm: nothing for the loop to do, so no pass (a pass per ask is CPU per call)
            if not woken:
                self.poke()
                woken = True
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                return result
            if waiter is None:  # wake on the next tick or finished action
                waiter = asyncio.ensure_future(self._changed.wait())
                owned = True
            else:
                owned = False  # a shared in-flight warm: never cancel it
            done, _ = await asyncio.wait({waiter}, timeout=remaining)
            if owned:
                waiter.cancel()
            if not done:
                return self._ensure_step(agent_id)[0]

    def _ensure_step(self, agent_id: str) -> tuple[EnsureResult, asyncio.Future[Any] | None]:
        """One look at the agent: (answer now, what to wait for next; None = the next change)."""
        computed = self._prefixes.get(agent_id)
        desired = self._desired
        if computed is None or desired is None:
            detail = self._prefix_errors.get(agent_id, "prefix not computed yet")
            return EnsureResult(agent_id, None, None, False, None, detail), None
        prefix_hash = computed.prefix.hash
        now = self._clock.now()
        found = self.agent_routes(agent_id)
        if found:
            return EnsureResult(agent_id, found[0].box_id, WarmState.WARM, True, prefix_hash, "warm"), None
        first: EnsureResult | None = None
        for box_id in desired.assignment.get(agent_id, ()):
            live = self._live[box_id]
            if not live.healthy or live.epoch is None or live.warmup is not WarmupStatus.DONE:
                continue
            record = self._records.get((box_id, live.epoch, prefix_hash))
            state = record.state if record is not None else WarmState.COLD
            waiting = self._in_flight.get((box_id, prefix_hash))
            if waiting is not None:
                return EnsureResult(
                    agent_id, box_id, WarmState.WARMING, False, prefix_hash, "warming"
                ), waiting
            if record is not None and is_serving(record):
                first = first or EnsureResult(
                    agent_id, box_id, state, False, prefix_hash, "warm, joining the route"
                )
                continue
            if (
                record is not None
                and record.state is WarmState.FAILED
                and now < retry_at(record, self._config.planner.retry)
            ):
                first = first or EnsureResult(
                    agent_id, box_id, state, False, prefix_hash, f"failed: {record.last_error}"
                )
                continue
            if record is not None and record.state is WarmState.WARMING:
                continue
            self._charge(box_id, computed.prefix.token_count, now)
            waiter = self._start_engine_work(box_id, live.epoch, prefix_hash, "precall", probe=False)
            return EnsureResult(agent_id, box_id, WarmState.WARMING, False, prefix_hash, "warming"), waiter
        if first is not None:
            return first, None
        return self._cold_stand_in(agent_id, prefix_hash), None

    def _cold_stand_in(self, agent_id: str, prefix_hash: str) -> EnsureResult:
        """No box of the agent's group can take the call (all down, or the agent fits nowhere warm): name a
        healthy, warmed-up box of its model anyway, cold and not ready, rather than no box at all. The same
        box every time for one agent (rendezvous), so its calls at least warm one cache."""
        model = self._agents[agent_id].model
        candidates = [
            box_id
            for box_id, box in self._boxes.items()
            if box.model == model
            and box_id not in self._drained
            and self._live[box_id].healthy
            and self._live[box_id].warmup is WarmupStatus.DONE
        ]
        if not candidates:
            return EnsureResult(agent_id, None, None, False, prefix_hash, "no warmed-up box serves its model")
        box_id = max(candidates, key=lambda b: stable_seed("stand-in", agent_id, b))
        detail = "no warm box in its group: this box is cold for the agent"
        return EnsureResult(agent_id, box_id, WarmState.COLD, False, prefix_hash, detail)

    def _charge(self, box_id: str, tokens: int, now: float) -> None:
        """A pre-call warm jumps the queue but still pays the box's token budget (others then wait)."""
        budget = self._config.planner.budget_for(box_id)
        bucket = refill(self._buckets.get(box_id), budget, now)
        self._buckets[box_id] = replace(bucket, tokens=bucket.tokens - tokens)
