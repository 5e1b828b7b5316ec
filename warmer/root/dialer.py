"""Wiring of the dialer front doors: the pre-call service, the campaign service, the schedule-file poller.

Built with the rest of the daemon once the store is open, over the reconciler. The schedule file is read on
an APScheduler interval job, as the reconciler's own timers are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from warmer.config.settings import Settings
from warmer.ports import StorePort
from warmer.root.engines import SystemClock
from warmer.root.logging import get_logger
from warmer.service.dialer.call_spread import CallVolumeMeter
from warmer.service.dialer.campaigns import CampaignService, ScheduleFileInvalid, ScheduleFileSync
from warmer.service.dialer.prewarm import PrewarmService, ReconcilerBackend
from warmer.service.reconciler import Reconciler


class DialerWiring:
    """The pre-call and schedule services of one daemon. `meter` counts pre-call asks (the reconciler
    reads the same meter as observed demand)."""

    def __init__(
        self,
        settings: Settings,
        *,
        agents: Callable[[], Collection[str]],
        store: StorePort,
        reconciler: Reconciler,
        meter: CallVolumeMeter,
    ) -> None:
        self._settings = settings
        self._log = get_logger(__name__)
        dialer = settings.dialer
        self.prewarm = PrewarmService(
            ReconcilerBackend(reconciler),
            SystemClock(),
            max_wait_seconds=dialer.prewarm_max_wait_seconds,
            meter=meter,
        )
        self.campaigns = CampaignService(store, agents, on_change=reconciler.poke)
        self.schedule: ScheduleFileSync | None = None
        if dialer.schedule_file is not None:
            self.schedule = ScheduleFileSync(dialer.schedule_file, store, agents, reconciler.poke)

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
