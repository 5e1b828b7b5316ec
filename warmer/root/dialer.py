"""Wiring of the dialer front doors: the pre-call service, the campaign service, the schedule-file poller.

Built once with the daemon (the API needs the services before anything runs); the store and the reconciler
exist only while the daemon runs, so both are reached through providers that answer 503 meanwhile. The
schedule file is read on an APScheduler interval job, as the reconciler's own timers are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from warmer.config.settings import Settings
from warmer.ports import Clock, StorePort
from warmer.root.logging import get_logger
from warmer.service.campaigns import (
    CampaignService,
    CampaignsUnavailable,
    ScheduleFileInvalid,
    ScheduleFileSync,
)
from warmer.service.prewarm import CallVolumeMeter, PrewarmService, ReconcilerBackend
from warmer.service.reconciler import Reconciler


class DialerWiring:
    """The pre-call and schedule services of one daemon."""

    def __init__(
        self,
        settings: Settings,
        *,
        agents: Callable[[], Collection[str]],
        store: Callable[[], StorePort | None],
        reconciler: Callable[[], Reconciler | None],
        clock: Clock,
    ) -> None:
        self._settings = settings
        self._store = store
        self._reconciler = reconciler
        self._log = get_logger(__name__)
        dialer = settings.dialer
        self.prewarm = PrewarmService(
            ReconcilerBackend(reconciler, agents),
            clock,
            max_wait_seconds=dialer.prewarm_max_wait_seconds,
            meter=CallVolumeMeter(clock, window_seconds=dialer.volume_window_seconds),
        )
        self.campaigns = CampaignService(self._open_store, agents, on_change=self._poke)
        self.schedule: ScheduleFileSync | None = None
        if dialer.schedule_file is not None:
            self.schedule = ScheduleFileSync(dialer.schedule_file, self._open_store, agents, self._poke)

    def _open_store(self) -> StorePort:
        store = self._store()
        if store is None:
            raise CampaignsUnavailable("the store is not open (daemon starting or stopping)")
        return store

    def _poke(self) -> None:
        reconciler = self._reconciler()
        if reconciler is not None:
            reconciler.poke()

    async def sync_schedule(self) -> None:
        """One read of the schedule file; a bad file is logged and changes nothing."""
        if self.schedule is None:
            return
        try:
            written, deleted = await self.schedule.sync()
        except ScheduleFileInvalid as exc:
            self._log.error(
                "schedule file rejected: nothing changed", path=str(self.schedule.path), error=str(exc)
            )
            return
        except CampaignsUnavailable:
            return
        if written or deleted:
            self._log.info("schedule file synced", written=written, deleted=deleted)

    async def run_schedule(self, stopping: asyncio.Event) -> None:
        """The `schedule` root task: read the file now, then every `dialer.poll_seconds`."""
        await self.sync_schedule()
        scheduler = AsyncIOScheduler(event_loop=asyncio.get_running_loop(), timezone="UTC")
        scheduler.add_job(
            self.sync_schedule,
            "interval",
            seconds=self._settings.dialer.poll_seconds,
            id="schedule-file",
            name="schedule file poll",
            coalesce=True,
            max_instances=1,
            misfire_grace_time=None,
        )
        scheduler.start()
        try:
            await stopping.wait()
        finally:
            scheduler.shutdown(wait=False)
