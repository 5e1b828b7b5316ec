"""The reconcile loop: a level-triggered controller that makes the engines hold what should be warm.

Each pass, under the fleet lock (a box added or removed never lands in the middle of one):
1. observe: each box's health and epoch, polled here or read from its lease holder (`restart_detection`:
   a new epoch is a restart, the box leaves every route at once), compute changed agents' stable
   prefixes (`catalogue`), reload the warm records (`records`), compute staged prompts and promote
   those that may become current (`prompts`);
2. desired: placement with move-before-switch handover (`desired`);
3. diff: the pure `plan` of Desired against Observed;
4. act: carry the actions out (`actions`: engine work as tasks, bounded per box, every transition written
   with a reason), then record boxes that became ready (`ready_reports`).

A missed event or a restart of the daemon only delays a fix by one pass: nothing here is edge-triggered
except the wake-up (`poke()`, from the root's timers and from finished work). On start, records verified
before the daemon started are re-probed, not trusted. Deploy events edit the fleet between passes
(`fleet_edits`); pre-call asks are answered by `precall`; several replicas: `replicas`. The parts are
built and wired in `parts`.

Size: the pass and the reconciler's whole public API on one page; each concern is a part of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence

import structlog

from warmer.core.agents import AgentSpec
from warmer.core.errors import StoreError
from warmer.core.model import BoxSpec, ModelProfile, WarmRecord
from warmer.core.planner import BoxObservation, Desired, Observed, WarmKey, plan
from warmer.core.readiness import Route, boxes_ready, routes
from warmer.ports import Clock, EnginePort, StorePort
from warmer.service.engine_work.restart_warmup import RestartWarmup
from warmer.service.engine_work.warming import WarmExecutor
from warmer.service.reconciler.parts import Hooks, build_parts
from warmer.service.reconciler.side_requests import SideSlot
from warmer.service.reconciler.types import (
    BoxLive,
    BoxSeen,
    EnsureResult,
    NullObserver,
    PendingPrompt,
    PrefixSource,
    ReconcileObserver,
    ReconcilerConfig,
    Snapshot,
)
from warmer.service.replicas.replica_gate import ReplicaGate


async def yield_to_asks() -> None:
    """One turn of the event loop between a pass's CPU-heavy steps (placement and handover, the plan,
    readiness): the pre-call asks that arrived meanwhile are answered before the next step instead of
    after the whole pass (tens of milliseconds at 1,000 agents). The pass holds the fleet lock across it,
    as across its store and engine awaits."""
    await asyncio.sleep(0)


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
        replicas: ReplicaGate | None = None,
        on_fleet_change: Callable[[Sequence[BoxSpec]], None] | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._last_pass = clock.monotonic()  # a pass's end, or the reconciler's birth before the first
        self._config = config = config or ReconcilerConfig()
        self._boxes = {box.id: box for box in boxes}
        self._profiles = dict(profiles)
        self._agents = dict(agents)
        log = self._log = structlog.stdlib.get_logger(__name__)
        self._started = False
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._fleet_lock = asyncio.Lock()
        self._observer = observer = observer or NullObserver()

        parts = build_parts(
            engine=engine,
            store=store,
            clock=clock,
            config=config,
            boxes=self._boxes,
            profiles=self._profiles,
            agents=self._agents,
            prefix_source=prefix_source,
            executor=executor,
            restart=restart,
            observer=observer,
            demand=demand,
            lock=self._fleet_lock,
            log=log,
            hooks=Hooks(
                poke=self.poke,
                notify_changed=self._notify_changed,
                changed=lambda: self._changed,
                routes_now=self._routes_now,
                agent_routes=self.agent_routes,
                joining_routes=self.joining_routes,
                lent_routes=self.lent_routes,
                recheck_box=self.recheck_box,
            ),
            gate=replicas,  # None: this daemon alone holds every box
            on_fleet_change=on_fleet_change,
        )
        self._book, self._rollout, self._health = parts.book, parts.rollout, parts.health
        self._activity, self._catalogue, self._staging = parts.activity, parts.catalogue, parts.staging
        self._desired, self._runner, self._ready = parts.desired, parts.runner, parts.ready
        self._promotion, self._fleet, self._precall = parts.promotion, parts.fleet, parts.precall
        self._side = parts.side
        self._replicas = self.replicas = parts.replicas  # leases and shared deploy state (the root's too)
        # What the box's KV cache events say, acted on (`evictions`); the event root task reports to it.
        self.evictions = parts.evictions

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Register the fleet in the store; from now on, older verifications are re-probed before use."""
        if self._started:
            return
        await self._replicas.sync_shared(registered=False)  # the fleet as every replica runs it
        await self._store.sync_boxes(list(self._boxes.values()))
        self._book.trusted_after = self._clock.now()
        self._started = True

    def poke(self) -> None:
        """Wake the loop for a pass as soon as it is free (several pokes coalesce into one pass)."""
        self._wake.set()

    async def run(self, stopping: asyncio.Event) -> None:
        """The root task: a pass on every poke until `stopping` is set; in-flight work is then cancelled."""
        await self.start()
        stop_waiter = asyncio.ensure_future(stopping.wait())
        try:
            while not stopping.is_set():
                self._wake.clear()
                try:
                    await self.tick()
                except StoreError as exc:  # a database blip: say so, keep going, the next pass retries
                    self._log.error("reconcile tick failed", error=f"{type(exc).__name__}: {exc}")
                wake_waiter = asyncio.ensure_future(self._wake.wait())
                await asyncio.wait({wake_waiter, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
                wake_waiter.cancel()
        finally:
            stop_waiter.cancel()
            await self.close()

    async def close(self) -> None:
        """Cancel work in flight (a `warming` row left behind is abandoned by the next daemon's planner)."""
        self._side.close()
        await self._runner.close()
        await self._replicas.wait_cancelled()

    async def wait_idle(self) -> None:
        """Wait until no engine work is running (tests and benchmarks step the loop with this)."""
        await self._runner.wait_idle()

    # ----------------------------------------------------------------------------------------------- pass

    async def tick(self) -> None:
        """One level-triggered pass: observe, desired, diff, act (engine work continues as tasks)."""
        async with self._fleet_lock:
            started = self._clock.monotonic()
            try:
                await self._tick()
            finally:  # a pass that ended on a store error still shows the loop alive
                self._last_pass = self._clock.monotonic()
                self._observer.pass_finished("full", self._last_pass - started)

    def stalled(self, bound_seconds: float) -> str | None:
        """Why the loop counts as wedged — no pass ended for more than `bound_seconds` (counted from
        start-up before the first) — or None. /healthz fails on it, so a liveness probe restarts it."""
        idle = self._clock.monotonic() - self._last_pass
        if idle <= bound_seconds:
            return None
        return f"no reconcile pass finished for {idle:.0f}s (reconcile.stall_seconds = {bound_seconds:g})"

    async def _tick(self) -> None:
        await self.start()
        await self._replicas.sync_shared(registered=True)
        now = self._clock.now()
        # observe
        await self._health.poll_all(list(self._boxes.values()), now, every=False)  # the timer polls them all
        await self._health.flush()  # a StoreError ends the pass; the view above already holds
        await self._catalogue.refresh(self._agents, self._profiles, now)
        await self._book.reload(self._health.current_epochs(), self._runner.in_flight)
        await self._replicas.refresh_foreign()
        await self._promotion.refresh(now)
        # desired
        campaigns = await self._store.list_campaigns()
        desired = await self._desired.build(
            now,
            campaigns,
            self._catalogue.refs(),
            precall=self._activity.held(now),
            last_activity=self._activity.last(),
        )
        await yield_to_asks()
        # diff
        result = plan(
            self._staging.with_pending(desired, now),
            self._observed(for_routes=False),
            now,
            self._config.planner,
        )
        # act
        self._runner.buckets = dict(result.buckets)  # before the turn: a pre-call warm then pays into these
        await yield_to_asks()
        await self._runner.dispatch([a for a in result.actions if self._replicas.acts_on(a.box_id)])
        await self._ready.note(self._health.live, desired, self._observed(for_routes=True))
        await yield_to_asks()
        self._observer.boxes_seen(self._boxes_seen())
        self._notify_changed()

    def _boxes_seen(self) -> list[BoxSeen]:
        seen: list[BoxSeen] = []
        for box_id, box in self._boxes.items():
            live = self._health.live.get(box_id)
            capacity = self._health.capacity.get(box_id)
            failure = None if live is None or live.healthy else (live.health_error_kind or "unhealthy")
            seen.append(
                BoxSeen(
                    box_id=box_id,
                    engine=box.engine.value,
                    model=box.model,
                    group=box.group,
                    version=capacity.version if capacity is not None else "",
                    healthy=live is not None and live.healthy,
                    failure=None if failure is None else str(failure),
                )
            )
        return seen

    def _observed(self, *, for_routes: bool) -> Observed:
        """What is: the boxes as last polled, the warm records (for routes: only trusted ones), the work
        in flight and the budgets."""
        return Observed(
            boxes={box_id: self._box_observation(box_id, live) for box_id, live in self._health.live.items()},
            warm=self._book.trusted() if for_routes else dict(self._book.records),
            in_flight=frozenset(self._runner.in_flight),
            buckets=dict(self._runner.buckets),
            suspect_boxes=frozenset(self._health.suspect),
            trusted_after=self._book.trusted_after,
            trusted_after_by_box=self._replicas.trusted_by_box(),
            keepalive_horizons=self.evictions.horizons(),
        )

    def _box_observation(self, box_id: str, live: BoxLive) -> BoxObservation:
        return BoxObservation(
            healthy=live.healthy,
            epoch=live.epoch,
            warmup=live.warmup,
            warmup_finished_at=live.warmup_finished_at,
            draining=self._rollout.is_draining(box_id),
        )

    def _notify_changed(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_changed(self) -> None:
        """Return after the next pass (readiness and routes may have changed); gateway sync waits here."""
        await self._changed.wait()

    # ------------------------------------------------------------------------------------------- views

    def snapshot(self) -> Snapshot:
        return Snapshot(
            now=self._clock.now(),
            boxes=dict(self._boxes),
            live={box_id: dataclasses.replace(live) for box_id, live in self._health.live.items()},
            desired=self._desired.current,
            observed=self._observed(for_routes=True),
            records=dict(self._book.records),
            prefixes=dict(self._catalogue.prefixes),
            prefix_errors=dict(self._catalogue.errors),
            config=self._config.planner,
            gate=self._config.gate,
            gate_answers=self._ready.gate,
            holders=self._replicas.holders(),
            replica_id=self._replicas.replica_id,
        )

    def ready_box_ids(self) -> set[str] | None:
        """Boxes ready now (the planner's `box_ready`); None before the first pass (not known yet)."""
        desired = self._desired.current
        if desired is None:
            return None
        observed, now = self._observed(for_routes=True), self._clock.now()
        answers = boxes_ready(self._boxes, desired, observed, now, self._config.planner)
        return {box_id for box_id, answer in answers.items() if answer.ready}

    def _routes_now(self, now: float) -> Mapping[str, tuple[Route, ...]] | None:
        desired = self._desired.current
        if desired is None:
            return None
        return routes(desired, self._observed(for_routes=True), now, self._config.planner)

    def agent_routes(self, agent_id: str) -> tuple[Route, ...]:
        """The agent's current routes (what `snapshot().routes()` holds for it), computed for it alone.
        A lookup is traffic for the agent: a call is about to use the answer (`touch`)."""
        self.touch(agent_id)
        desired = self._desired.current
        if desired is None:
            return ()
        routing = desired.routing if desired.routing is not None else desired.assignment
        return self._routes_over(desired, agent_id, routing.get(agent_id, ()))

    def joining_routes(self, agent_id: str) -> tuple[Route, ...]:
        """The agent's routes with every box of its group where its prefix is verified warm joined, as
        the next pass's handover joins them: a pre-call ask need not wait for that pass."""
        desired = self._desired.current
        if desired is None:
            return ()
        return self._routes_over(desired, agent_id, desired.assignment.get(agent_id, ()))

    def lent_routes(self, agent_id: str, boxes: tuple[str, ...]) -> tuple[Route, ...]:
        """The agent's routes over boxes lent to it just in time (`loans`), before a pass joins them."""
        desired = self._desired.current
        return () if desired is None else self._routes_over(desired, agent_id, boxes)

    def _routes_over(self, desired: Desired, agent_id: str, group: tuple[str, ...]) -> tuple[Route, ...]:
        """`routes()` for one agent routed over `group`, observing only what it reads there: the group's
        boxes and, on each, the trusted record of the agent's prefix in the box's current epoch. An ask
        costs O(its group) instead of a copy of every box and warm record of the fleet."""
        ref = desired.agents.get(agent_id)
        if ref is None:
            return ()
        boxes: dict[str, BoxObservation] = {}
        warm: dict[WarmKey, WarmRecord] = {}
        for box_id in group:
            live = self._health.live.get(box_id)
            if live is None:
                continue
            boxes[box_id] = self._box_observation(box_id, live)
            key = (box_id, live.epoch or "", ref.hash)
            record = self._book.records.get(key)
            if record is not None and self._book.is_trusted(record):
                warm[key] = record
        one = dataclasses.replace(desired, routing={agent_id: group})
        observed = Observed(boxes=boxes, warm=warm, trusted_after=self._book.trusted_after)
        found = routes(one, observed, self._clock.now(), self._config.planner, only=(agent_id,))
        return found.get(agent_id, ())

    def prefix_slot(self, agent_id: str, box_id: str) -> int | None:
        """The engine slot holding the agent's current prefix on the box, when pinned (llama.cpp): a call
        that names it (`id_slot`) waits for its own slot instead of evicting another agent's prompt."""
        computed = self._catalogue.get(agent_id)
        live = self._health.live.get(box_id)
        if computed is None or live is None or live.epoch is None:
            return None
        return self._book.serving_slot((box_id, live.epoch, computed.prefix.hash))

    def note_call(self, agent_id: str, box_id: str, slot: int) -> None:
        """A pre-call answer sent a call for the agent to this slot of the box: until the call is likely
        over (`precall_call_hold_seconds`) its turns may overwrite any other prefix put there."""
        computed = self._catalogue.get(agent_id)
        live = self._health.live.get(box_id)
        if computed is None or live is None or live.epoch is None:
            return
        key = (box_id, live.epoch, computed.prefix.hash)
        self._book.note_call(key, slot, self._clock.now(), self._config.precall_call_hold_seconds)

    async def side_slot(self, box_id: str, wait_seconds: float = 0.0) -> SideSlot:
        """The slot a side request (no agent's call) should name on the box (`side_requests`)."""
        return await self._side.lend(box_id, wait_seconds)

    def fleet(self) -> Mapping[str, BoxSpec]:
        """The boxes this reconciler may call now (config plus runtime `box.added`)."""
        return dict(self._boxes)

    def box(self, box_id: str) -> BoxSpec | None:
        """One box of `fleet()`, without copying the fleet (a pre-call ask looks up its box)."""
        return self._boxes.get(box_id)

    def agent_specs(self) -> Mapping[str, AgentSpec]:
        return dict(self._agents)

    def knows(self, agent_id: str) -> bool:
        """Whether `agent_specs()` holds the agent, without copying them (checked on every pre-call ask)."""
        return agent_id in self._agents

    def profile_names(self) -> frozenset[str]:
        return frozenset(self._profiles)

    def pending_prompts(self) -> Mapping[str, PendingPrompt]:
        return self._staging.pending()

    def draining(self) -> Mapping[str, str]:
        """Boxes taken out of service by a rollout, with why."""
        return self._rollout.draining()

    def drained_boxes(self) -> frozenset[str]:
        """Draining boxes that no route uses any more: safe to restart without a call meeting them."""
        return self._rollout.drained(self._desired.routed_box_ids())

    # ------------------------------------------------------------------------------ signals and edits

    def touch(self, agent_id: str) -> None:
        """Traffic for the agent (a route lookup, a pre-call ask): keep its prefix warm; agents idle longer
        than `retire_idle_after_seconds` stop being kept warm."""
        self._activity.touch(agent_id, self._clock.now())

    def set_suspect(self, box_id: str, suspect: bool) -> None:
        """The hit-rate monitor's verdict: a suspect box gets its warm prefixes probed (rate-limited)."""
        if box_id not in self._boxes:
            return
        self._health.set_suspect(box_id, suspect)
        self.poke()

    async def poll_health(self) -> None:
        """The health timer's light path: poll each box's health and epoch (or read its holder's) and apply
        them to the view, and wake a full pass only when something changed (a box went up or down, or
        restarted). A box that went down or restarted leaves readiness and the routes at once."""
        if not self._started:
            return  # the loop registers the fleet first; its first pass polls anyway
        async with self._fleet_lock:
            started = self._clock.monotonic()
            changed = await self._health.poll_all(list(self._boxes.values()), self._clock.now())
            try:
                await self._health.flush()
            except StoreError as exc:  # the view holds; the next pass writes it
                self._log.warning("box health not stored yet", error=str(exc))
            self._observer.pass_finished("health", self._clock.monotonic() - started)
        if changed:
            self._notify_changed()
            self.poke()

    async def recheck_box(self, box_id: str) -> None:
        """Look at one box now, between polls: a caller retrying a call it was given this box for has met
        trouble there (a restart is over sooner than a poll interval), so a new process must not be
        answered as the warm old one. A changed epoch or a box down leaves the routes before the answer."""
        box = self._boxes.get(box_id)
        if box is None:
            return
        if await self._health.recheck(box, self._fleet_lock):
            self._notify_changed()
            self.poke()

    async def ensure_warm(self, agent_id: str, wait_seconds: float = 0.0) -> EnsureResult:
        """The box a call for `agent_id` should use, warming the agent's prefix there if needed
        (`warmer.service.reconciler.precall`)."""
        return await self._precall.ensure_warm(agent_id, wait_seconds)

    def stage_prompt(self, spec: AgentSpec) -> None:
        """Warm `spec`'s prefix beside the current one, current once warm (`PromptPromotion.stage`)."""
        self._promotion.stage(spec)
        self.poke()

    def drain_boxes(self, box_ids: Sequence[str], reason: str) -> None:
        """A rollout will restart these boxes: hand their agents to the rest of the fleet first
        (`Rollout.drain`)."""
        self._rollout.drain(box_ids, reason)
        self._notify_changed()
        self.poke()

    def undrain_boxes(self, box_ids: Sequence[str], epoch_tag: str) -> None:
        """Back in service as a new epoch (`<engine epoch>~<tag>`): restart warm-up, prefixes, routes."""
        self._rollout.undrain(box_ids, epoch_tag)
        self.poke()

    async def add_box(self, box: BoxSpec) -> None:
        """A new box joins the fleet (registered in the store); it is warmed before any route uses it."""
        await self._fleet.add_box(box)
        self.poke()

    async def remove_box(self, box_id: str) -> None:
        """A box leaves the fleet: out of routes at once, its engine work cancelled, its rows dropped."""
        await self._fleet.remove_box(box_id)
        self.poke()
