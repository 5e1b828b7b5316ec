"""The restart warm-up of a box's new epoch, run as a task: the engine-side work is
`warmer.service.engine_work.restart_warmup`; this records its phases and outcome (event log, phase row,
the box's live health that readiness reads) and wakes the loop, so the prefixes' warms start only after it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import structlog

from warmer.core.agents import AgentSpec
from warmer.core.errors import WarmerError
from warmer.core.event_kinds import EventKind
from warmer.core.fleet_pacing import WorkKind, restart_warmup_cost
from warmer.core.model import BoxSpec, LoggedEvent, ModelProfile, PhaseName, PhaseRecord
from warmer.core.plan_actions import RunRestartWarmup
from warmer.core.planner import WarmupStatus
from warmer.ports import Clock, StorePort
from warmer.service.engine_work.fleet_pacer import FleetPacer
from warmer.service.engine_work.restart_warmup import RestartOutcome, RestartWarmup, long_prefill_target
from warmer.service.reconciler.catalogue import PrefixCatalogue
from warmer.service.reconciler.restart_detection import BoxHealth
from warmer.service.reconciler.types import ReconcileObserver


class RestartRuns:
    """Starts restart warm-ups through the action runner's task set (`spawn`) and records how each ended."""

    def __init__(
        self,
        *,
        store: StorePort,
        clock: Clock,
        restart: RestartWarmup,
        observer: ReconcileObserver,
        log: structlog.stdlib.BoundLogger,
        boxes: Mapping[str, BoxSpec],
        profiles: Mapping[str, ModelProfile],
        agents: Mapping[str, AgentSpec],
        health: BoxHealth,
        catalogue: PrefixCatalogue,
        poke: Callable[[], None],
        spawn: Callable[[Awaitable[None], str], None],
        pacer: FleetPacer,
        box_value: Callable[[str], float],
    ) -> None:
        self._store = store
        self._clock = clock
        self._restart = restart
        self._observer = observer
        self._log = log
        self._boxes = boxes
        self._profiles = profiles
        self._agents = agents
        self._health = health
        self._catalogue = catalogue
        self._poke = poke
        self._spawn = spawn
        self._pacer = pacer
        self._box_value = box_value

    def start(self, action: RunRestartWarmup) -> None:
        """Mark the box's warm-up running and run it as a task named for the box (so leaving cancels it).
        It waits its turn in the fleet pacer first, the boxes holding the most valuable agents first; a
        queued warm-up counts as running, so the box is not ready meanwhile."""
        live = self._health.live[action.box_id]
        live.warmup = WarmupStatus.RUNNING
        live.warmup_error = None
        self._spawn(self._task(action), f"restart-warmup:{action.box_id}")

    async def _task(self, action: RunRestartWarmup) -> None:
        with structlog.contextvars.bound_contextvars(
            box=action.box_id, epoch=action.epoch, action="restart-warmup"
        ):
            await self._paced(action)

    async def _paced(self, action: RunRestartWarmup) -> None:
        box = self._boxes[action.box_id]
        profile = self._profiles[box.model]
        longest = self._catalogue.longest(box.model, self._agents)
        cost = restart_warmup_cost(profile, long_prefill_target(profile.restart, profile, longest), box.slots)
        value = self._box_value(box.id)
        async with self._pacer.admitted(WorkKind.RESTART_WARMUP, box.id, value=value, cost_tokens=cost):
            if self._health.live[box.id].epoch != action.epoch:
                self._poke()  # restarted again while it waited: the new epoch gets its own warm-up
                return
            await self._run(action, box, profile, longest)

    async def _run(
        self, action: RunRestartWarmup, box: BoxSpec, profile: ModelProfile, longest: int | None
    ) -> None:
        outcome: RestartOutcome | None = None
        error: str | None = None
        try:
            outcome = await self._restart.run(box, profile, action.epoch, longest_prefix=longest)
            error = outcome.error
        except WarmerError as exc:
            error = f"{type(exc).__name__}: {exc}"
        now = self._clock.now()
        live = self._health.live[action.box_id]
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
                    at=now, kind=EventKind.RESTART_WARMUP, box_id=box.id, epoch=action.epoch, detail=detail
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
            self._poke()
