"""This replica's box leases: renewed by heartbeat (`run`, a root task), asked before any engine work.

The rules are `warmer.core.leases`; the store applies them (`CoordinationPort.heartbeat`). What this adds
is the replica's own, conservative view of what it holds: a lease counts as held only until `lease_seconds`
(less a margin) after the START of the heartbeat that last renewed it, measured on the monotonic clock. The
database stamped the expiry later than that, so a replica that cannot reach the database (an outage, a
partition) stops acting on its boxes before anyone else may take them.

On a graceful stop every lease is given back at once, so the survivors take the boxes at their next
heartbeat instead of after the lease runs out.
"""

from __future__ import annotations

import asyncio
import math
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Collection
from typing import Literal, Protocol

import structlog

from warmer.core.errors import StoreError
from warmer.core.leases import LeaseConfig, LeaseView
from warmer.ports import Clock, CoordinationPort


class LeaseHolder(Protocol):
    """What the reconciler asks of this replica's leases (`BoxOwnership`, or `SoleOwnership` alone)."""

    @property
    def replica_id(self) -> str: ...

    def owns(self, box_id: str) -> bool: ...

    def owner_of(self, box_id: str) -> str | None: ...

    def trusted_after(self, box_id: str, started_at: float) -> float: ...


class SoleOwnership:
    """One daemon alone on its database (an embedded SQLite file, which it holds locked): every box is
    its own, always, and what it verified since its start is trusted. Nothing to renew."""

    def __init__(self, replica_id: str | None = None) -> None:
        self._replica_id = replica_id or default_replica_id()

    @property
    def replica_id(self) -> str:
        return self._replica_id

    def owns(self, box_id: str) -> bool:
        return True

    def owner_of(self, box_id: str) -> str | None:
        return self._replica_id

    def trusted_after(self, box_id: str, started_at: float) -> float:
        return started_at


# Least time between two heartbeats woken early (a notification storm must not become a heartbeat storm).
MIN_EARLY_BEAT_SECONDS = 0.25


def default_replica_id() -> str:
    """<hostname>-<pid>-<random>: unique per process, readable in the lease table."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class BoxOwnership:
    """Which boxes this replica may send engine work to, renewed every `renew_seconds`."""

    def __init__(
        self,
        *,
        coordination: CoordinationPort,
        clock: Clock,
        config: LeaseConfig,
        fleet: Callable[[], Collection[str]],
        replica_id: str | None = None,
        on_change: Callable[[frozenset[str], frozenset[str]], None] | None = None,
        busy: Callable[[], Collection[str]] | None = None,
    ) -> None:
        self._busy = busy or (lambda: ())  # boxes with work in flight: never handed back mid-work
        self._coordination = coordination
        self._clock = clock
        self._config = config
        self._fleet = fleet
        self._replica_id = replica_id or default_replica_id()
        self._on_change = on_change
        self._log = structlog.stdlib.get_logger(__name__)
        self._held: frozenset[str] = frozenset()
        self._valid_until = -math.inf  # monotonic
        self._view: LeaseView | None = None
        self._wake = asyncio.Event()
        self._reported: frozenset[str] = frozenset()
        self._started_at = clock.now()
        self.beats = 0

    @property
    def replica_id(self) -> str:
        return self._replica_id

    @property
    def config(self) -> LeaseConfig:
        return self._config

    def owns(self, box_id: str) -> bool:
        return box_id in self._held and self._clock.monotonic() < self._valid_until

    def owned(self) -> frozenset[str]:
        return self._held if self._clock.monotonic() < self._valid_until else frozenset()

    def view(self) -> LeaseView | None:
        """The leases as the last heartbeat saw them (None before the first one succeeded)."""
        return self._view

    def owner_of(self, box_id: str) -> str | None:
        return None if self._view is None else self._view.owner_of(box_id)

    def trusted_after(self, box_id: str, started_at: float) -> float:
        """Warm records of `box_id` verified before this time were not verified by its current holder
        during its holding: the holder re-probes them, and nobody routes on them meanwhile. For a box this
        replica holds, also not before `started_at` (its own start: the planner's `trusted_after`)."""
        lease = None if self._view is None else self._view.leases.get(box_id)
        acquired = None if lease is None else lease.acquired_at
        if self.owns(box_id):
            return max(started_at, acquired if acquired is not None else started_at)
        return acquired if acquired is not None else math.inf

    def wake(self) -> None:
        """Heartbeat soon (another replica released or took leases)."""
        self._wake.set()

    async def beat(self) -> None:
        """One heartbeat. A StoreError is raised after the held set has been re-checked against the local
        deadline (leases then lapse on their own)."""
        started = self._clock.monotonic()
        try:
            view = await self._coordination.heartbeat(
                self.replica_id,
                sorted(self._fleet()),
                at=self._clock.now(),
                config=self._config,
                detail={"pid": os.getpid(), "host": socket.gethostname()},
                busy=sorted(self._busy()),
            )
        except StoreError:
            self._report()
            raise
        self._view = view
        self._held = view.held_by(self.replica_id)
        self._valid_until = started + self._config.lease_seconds - self._config.local_margin_seconds
        self.beats += 1
        self._report()

    def _report(self) -> None:
        """Tell the reconciler what it gained and lost since the last report."""
        now_held = self.owned()
        gained, lost = now_held - self._reported, self._reported - now_held
        self._reported = now_held
        if not gained and not lost:
            return
        self._log.info(
            "box leases changed", replica=self.replica_id, gained=sorted(gained), lost=sorted(lost)
        )
        if self._on_change is not None:
            self._on_change(gained, lost)

    async def run(
        self, stopping: asyncio.Event, *, before_release: Callable[[], Awaitable[object]] | None = None
    ) -> None:
        """The `leases` root task: heartbeat until `stopping`, then give every lease back, after
        `before_release` (the reconciler's own work cancelled, so no successor overlaps it)."""
        stop = asyncio.ensure_future(stopping.wait())
        try:
            while not stopping.is_set():
                self._wake.clear()
                try:
                    await self.beat()
                except StoreError as exc:
                    self._log.warning("lease heartbeat failed", replica=self.replica_id, error=str(exc))
                await self._sleep_until_next(stop)
        finally:
            stop.cancel()
            if before_release is not None:
                await before_release()
            await self._release()

    async def _sleep_until_next(self, stop: asyncio.Future[Literal[True]]) -> None:
        """Until the next heartbeat: `renew_seconds`, or sooner (not before a short pause) when woken, and
        never past the moment the held leases lapse locally (so a lapse is reported on time)."""
        renew = self._config.renew_seconds
        if self.owned():  # wake when the held leases lapse locally, to report the loss on time
            renew = max(0.0, min(renew, self._valid_until - self._clock.monotonic()))
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            done, _ = await asyncio.wait((woken, stop), timeout=renew, return_when=asyncio.FIRST_COMPLETED)
            if woken in done and stop not in done:
                await asyncio.wait({stop}, timeout=MIN_EARLY_BEAT_SECONDS)
        finally:
            woken.cancel()
        self._report()

    async def _release(self) -> None:
        held, self._held, self._valid_until = self._held, frozenset(), -math.inf
        self._report()
        try:
            await self._coordination.release(self.replica_id, leave=True)
        except StoreError as exc:  # they expire by themselves within lease_seconds
            self._log.warning(
                "leases not released", replica=self.replica_id, boxes=sorted(held), error=str(exc)
            )
            return
        self._log.info("box leases released", replica=self.replica_id, boxes=sorted(held))
