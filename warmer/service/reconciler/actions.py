"""The action runner: carries the plan's actions out.

Bookkeeping transitions (mark stale, retire, abandon) are written at once. Engine work (warm, probe,
restart warm-up) runs as named tasks: at most one warm or probe per (box, prefix) at a time (callers of
the same work await the same future) and within the box's concurrency budget (`slots`), which pre-call
warms pass through too. Each piece of work writes its transition with a reason, so the store holds the
history, and wakes the loop when done. How a warm is verified is `warmer.service.engine_work.warming`; a
warm whose slot was overwritten before its probe is warmed again in `contests`; the restart warm-up runs in
`restart_runs`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from typing import Any

import structlog

from warmer.core.agents import AgentSpec
from warmer.core.errors import LeaseLost, WarmerError
from warmer.core.model import (
    BoxSpec,
    ModelProfile,
    Prefix,
    WarmRecord,
    WarmState,
)
from warmer.core.plan_actions import (
    AbandonWarm,
    Action,
    MarkStale,
    ProbePrefix,
    Retire,
    RunRestartWarmup,
    WarmPrefix,
    WarmReason,
)
from warmer.core.planner import WarmKey
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
    transition,
)
from warmer.ports import Clock, StorePort
from warmer.service.engine_work.fleet_pacer import FleetPacer
from warmer.service.engine_work.restart_warmup import RestartWarmup
from warmer.service.engine_work.warming import WarmExecutor, WarmOutcome
from warmer.service.reconciler.catalogue import PrefixCatalogue
from warmer.service.reconciler.contests import ContestedWarms
from warmer.service.reconciler.evictions import EvictionReactions
from warmer.service.reconciler.prompts import PromptStaging
from warmer.service.reconciler.records import WarmBook
from warmer.service.reconciler.restart_detection import BoxHealth
from warmer.service.reconciler.restart_runs import RestartRuns
from warmer.service.reconciler.types import ReconcileObserver, ReconcilerConfig
from warmer.service.reconciler.work_values import EngineTicket, WorkValues

Waiter = asyncio.Future[WarmRecord | None]


class ActionRunner:
    """Engine work in flight (`in_flight`: (box, prefix) -> its future), the per-box token buckets the
    plan left (`buckets`), the per-box concurrency, and the tasks running."""

    def __init__(
        self,
        *,
        store: StorePort,
        clock: Clock,
        config: ReconcilerConfig,
        executor: WarmExecutor,
        restart: RestartWarmup,
        observer: ReconcileObserver,
        log: structlog.stdlib.BoundLogger,
        boxes: Mapping[str, BoxSpec],
        profiles: Mapping[str, ModelProfile],
        agents: Mapping[str, AgentSpec],
        health: BoxHealth,
        book: WarmBook,
        catalogue: PrefixCatalogue,
        staging: PromptStaging,
        poke: Callable[[], None],
        pacer: FleetPacer,
        values: WorkValues,
        evictions: EvictionReactions | None = None,
        blocked: Callable[[str, str], bool] = lambda _box_id, _prefix_hash: False,
    ) -> None:
        self._clock = clock
        self._blocked = blocked  # (box, prefix): its room there is lent to another agent now (`loans`)
        self._config = config
        self._executor = executor
        self._observer = observer
        self._log = log
        self._boxes = boxes
        self._profiles = profiles
        self._health = health
        self._book = book
        self._catalogue = catalogue
        self._staging = staging
        self._poke = poke
        self._evictions = evictions
        self._pacer = pacer  # fleet-wide admission of every piece of engine work, most valuable first
        self._values = values
        self.in_flight: dict[tuple[str, str], Waiter] = {}
        self._finished = asyncio.Event()  # set (and replaced) each time engine work finishes
        self.buckets: dict[str, TokenBucket] = {}
        self._box_slots: dict[str, asyncio.Semaphore] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._contests = ContestedWarms(
            executor=executor, book=book, health=health, config=config, observer=observer, log=log,
            now=clock.now, blocked=blocked, charge=pacer.charge,
        )  # fmt: skip
        self._restarts = RestartRuns(
            store=store, clock=clock, restart=restart, observer=observer, log=log, boxes=boxes,
            profiles=profiles, agents=agents, health=health, catalogue=catalogue, poke=poke,
            spawn=self._spawn, pacer=pacer, box_value=values.box,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------ dispatch

    async def dispatch(self, actions: Sequence[Action]) -> None:
        self._pacer.refresh_rate()  # boxes join and leave between passes
        for action in actions:
            if isinstance(action, RunRestartWarmup):
                self._restarts.start(action)
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
            elif isinstance(action, WarmPrefix | ProbePrefix):
                if self._blocked(action.box_id, action.prefix_hash):
                    continue  # planned before its room was lent: warming it would evict the borrower
                # A keepalive of a prefix the KV events say is held: one probe touches and verifies it.
                probe = isinstance(action, ProbePrefix) or (
                    self._evictions is not None and self._evictions.touch_by_probe(action)
                )
                self.start_engine_work(
                    action.box_id,
                    action.epoch,
                    action.prefix_hash,
                    str(action.reason),
                    probe=probe,
                    agents=action.agent_ids,
                    urgent=action.reason is WarmReason.PRECALL,
                )

    async def _apply(self, box_id: str, epoch: str, prefix_hash: str, event: WarmEvent, reason: str) -> None:
        """A bookkeeping transition (no engine request), written with its reason."""
        key = (box_id, epoch, prefix_hash)
        record = self._book.get(key)
        if record is None:
            return
        try:
            updated = transition(record, event, self._clock.now(), self._config.planner.retry)
        except IllegalTransition as exc:
            self._log.warning("skipped a transition the record no longer allows", error=str(exc))
            return
        await self._book.write(updated, reason=reason, previous=record.state)
        if not is_serving(updated) and updated.state is not WarmState.WARMING:
            self._book.release_pin(key)

    def charge(self, box_id: str, tokens: int, now: float) -> None:
        """A pre-call warm jumps the queue but still pays the box's token budget (others then wait)."""
        budget = self._config.planner.budget_for(box_id)
        bucket = refill(self.buckets.get(box_id), budget, now)
        self.buckets[box_id] = replace(bucket, tokens=bucket.tokens - tokens)

    # ------------------------------------------------------------------------------------------- tasks

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

    async def wait_idle(self) -> None:
        """Wait until no task is running (tests and benchmarks step the loop with this)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def cancel_box(self, box_id: str) -> None:
        """Cancel the box's engine work (it left the fleet)."""
        mine = [
            t for t in self._tasks if t.get_name().endswith(f":{box_id}") or f":{box_id}:" in t.get_name()
        ]
        for task in mine:
            task.cancel()
        await asyncio.gather(*mine, return_exceptions=True)

    async def close(self) -> None:
        """Cancel work in flight (a `warming` row left behind is abandoned by the next daemon's planner)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._pacer.close()
        for waiter in self.in_flight.values():
            if not waiter.done():
                waiter.set_result(None)
        self.in_flight.clear()

    # ------------------------------------------------------------------------------ warms and probes

    def start_engine_work(
        self,
        box_id: str,
        epoch: str,
        prefix_hash: str,
        reason: str,
        *,
        probe: bool,
        agents: Sequence[str] = (),
        urgent: bool = False,
    ) -> Waiter:
        """Send one warm (or probe) of (box, prefix) unless one is in flight; return the future to await.
        It waits its turn in the fleet pacer first (`urgent`: a pre-call warm, admitted at once). Every
        line logged while it runs carries the box, the prefix, the action and the prefix's agents."""
        key = (box_id, prefix_hash)
        waiter = self.in_flight.get(key)
        if waiter is not None:
            return waiter
        waiter = asyncio.get_running_loop().create_future()
        self.in_flight[key] = waiter
        work = (
            self._probe(box_id, epoch, prefix_hash, reason)
            if probe
            else self._warm(box_id, epoch, prefix_hash, reason)
        )
        action = "probe" if probe else "warm"
        context = {"box": box_id, "prefix": prefix_hash, "action": action, "agent": ",".join(agents) or None}
        prefix = self._prefix_of(prefix_hash)
        requests = 1 if probe else self._profiles[self._boxes[box_id].model].warm_requests_per_prefix
        tokens = prefix.token_count if prefix is not None else 0
        ticket = self._values.ticket(agents, tokens, requests, probe=probe, urgent=urgent)
        self._spawn(self._engine_task(key, waiter, work, context, ticket), f"{action}:{box_id}:{prefix_hash}")
        return waiter

    async def _engine_task(
        self,
        key: tuple[str, str],
        waiter: Waiter,
        work: Coroutine[Any, Any, WarmRecord | None],
        context: dict[str, Any],
        ticket: EngineTicket,
    ) -> None:
        with structlog.contextvars.bound_contextvars(**context):
            await self._run_engine_work(key, waiter, work, ticket)

    async def _run_engine_work(
        self,
        key: tuple[str, str],
        waiter: Waiter,
        work: Coroutine[Any, Any, WarmRecord | None],
        ticket: EngineTicket,
    ) -> None:
        result: WarmRecord | None = None
        try:
            async with (
                self._pacer.admitted(
                    ticket.kind, key[0], value=ticket.value, cost_tokens=ticket.cost, urgent=ticket.urgent
                ),
                self._slots(key[0]),
            ):
                result = await work
        except LeaseLost as exc:  # another replica holds the box now: its result is not ours to record
            self._log.warning("warm result not written: the box's lease is held elsewhere", error=str(exc))
        except WarmerError as exc:
            self._log.error(
                "warm work failed", box=key[0], prefix=key[1], error=f"{type(exc).__name__}: {exc}"
            )
        finally:
            work.close()  # never started when its wait was cancelled (no "never awaited" warning)
            if self.in_flight.get(key) is waiter:
                del self.in_flight[key]
            if not waiter.done():
                waiter.set_result(result)
            finished, self._finished = self._finished, asyncio.Event()
            finished.set()
            self._poke()

    def work_finished(self) -> asyncio.Event:
        """Set as soon as the next piece of engine work (a warm, a probe) finishes, verified or not."""
        return self._finished

    def _prefix_of(self, prefix_hash: str) -> Prefix | None:
        current = self._catalogue.prefix(prefix_hash)
        return current if current is not None else self._staging.prefix(prefix_hash)

    async def _warm(self, box_id: str, epoch: str, prefix_hash: str, reason: str) -> WarmRecord | None:
        box, prefix = self._boxes[box_id], self._prefix_of(prefix_hash)
        if prefix is None or self._health.live[box_id].epoch != epoch:
            return None
        profile = self._profiles[box.model]
        key = (box_id, epoch, prefix_hash)
        now = self._clock.now()
        record = self._book.get(key)
        before = (
            record if record is not None else new_record(box_id, epoch, prefix_hash, prefix.token_count, now)
        )
        try:
            started = transition(before, WarmStarted(), now, self._config.planner.retry)
        except IllegalTransition:
            return before  # already warm, warming elsewhere, or failed within its backoff: nothing to send
        await self._book.write(
            started, reason=f"warm started: {reason}", previous=record.state if record is not None else None
        )
        # a slot overwritten before the probe is warmed again at once (bounded), not failed into the backoff
        started, outcome = await self._contests.warm(key, started, box, profile, prefix, reason)
        return await self._finish(key, started, outcome, kind="warm", reason=reason)

    async def _probe(self, box_id: str, epoch: str, prefix_hash: str, reason: str) -> WarmRecord | None:
        box, prefix = self._boxes[box_id], self._prefix_of(prefix_hash)
        key = (box_id, epoch, prefix_hash)
        record = self._book.get(key)
        if prefix is None or record is None or self._health.live[box_id].epoch != epoch:
            return None
        outcome = await self._executor.probe(
            box, self._profiles[box.model], prefix, slot=self._book.slot(key)
        )
        return await self._finish(key, record, outcome, kind="probe", reason=reason)

    async def _finish(
        self, key: WarmKey, record: WarmRecord, outcome: WarmOutcome, *, kind: str, reason: str
    ) -> WarmRecord | None:
        box_id, epoch, _ = key
        live = self._health.live[box_id]
        if live.epoch != epoch:
            self._log.info("epoch changed during a warm: result dropped", box=box_id, epoch=epoch)
            return None
        live.prefix_engine_seconds += outcome.engine_seconds or 0.0
        live.prefix_requests += outcome.requests_sent
        if kind == "probe" and not outcome.answered:
            # Not an eviction: nothing is known of the cache. The record stays as it was (an untrusted one
            # stays out of routes) and the planner probes it again on a later pass.
            self._observer.warm_finished(box_id, kind, reason, "unknown", outcome.wall_seconds)
            self._log.warning("probe could not ask the engine: state unchanged", reason=outcome.reason)
            return record
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
            updated = transition(record, event, self._clock.now(), self._config.planner.retry)
        except IllegalTransition as exc:
            self._log.warning("warm result no longer applies", error=str(exc))
            return record
        await self._book.write(updated, reason=why, previous=record.state)
        if outcome.verified and self._evictions is not None:
            self._evictions.verified(self._boxes[box_id], self._prefix_of(key[2]))
        if outcome.verified and outcome.slot is not None:
            self._book.keep_pin(key, outcome.slot)
        elif not outcome.verified:
            self._book.release_pin(key)
        verdict = "verified" if outcome.verified else ("cold" if kind == "probe" else "failed")
        self._observer.warm_finished(box_id, kind, reason, verdict, outcome.wall_seconds)
        self._observer.warm_tokens(box_id, outcome.prefix_tokens * outcome.requests_sent)
        if not outcome.verified:
            self._log.warning(f"{kind} not verified", box=box_id, prefix=key[2], reason=outcome.reason)
        return updated
