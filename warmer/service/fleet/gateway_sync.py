"""Gateway sync: the router in front of the boxes routes only to boxes warmer declared ready.

Level-triggered, like the reconciler: every pass reads the router's worker list (the truth: an add the
router kept retrying may land long after it was asked for, an operator may add a worker by hand) and
compares it with the set of ready boxes, then

* deregisters every listed fleet box that is not ready (restarted, cold, failed, unknown), first, so a
  box leaving readiness stops getting calls before anything else happens, whatever state the router
  shows for it (healthy, unhealthy, Failed: the router may re-admit an unhealthy worker on its own);
* registers every ready box the router does not list, and every ready box whose listing the router
  cannot use (health checks failing, smg's terminal Failed): listed is not routed, so the registration is
  replaced.

A pass runs every `interval_seconds` and also right after the ready set changes (the readiness source
says when something may have changed; a pass runs only when the set really differs, so a busy reconciler
does not turn into a stream of router calls).

Ownership: only workers whose URL is one of our boxes' base URLs are ever touched. A router may front
other pools too (another team's boxes, a canary managed by hand); those "foreign" workers are counted and
left alone, because removing a worker warmer does not manage would be an outage warmer cannot undo. The
fleet can change while the daemon runs (box added/removed events), so it is read on every pass, and a box
that left the fleet stays "ours" for the rest of the process: it is not ready, so it is withdrawn.

A router outage or a failed add/remove is logged, counted and retried on the next pass; it never ends
the daemon (`run` only returns when asked to stop).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from warmer.core.errors import WarmerError
from warmer.core.model import BoxSpec
from warmer.ports import Clock, GatewayPort


class ReadinessSource(Protocol):
    """Which boxes may take traffic now, and a way to hear that this may have changed."""

    def ready_box_ids(self) -> set[str] | None:
        """Ids of the boxes that are ready right now; None while not known yet (no reconcile pass since
        the daemon started), when a pass must change nothing: "no box is ready" would withdraw a healthy
        fleet from the router on every daemon restart."""
        ...

    async def wait_changed(self) -> None:
        """Return once readiness may have changed (e.g. after the next reconcile pass)."""
        ...


class SyncOutcome(enum.StrEnum):
    OK = "ok"  # the router matched the ready set when the pass ended
    PARTIAL = "partial"  # some add/remove failed; the next pass retries
    GATEWAY_UNAVAILABLE = "gateway_unavailable"  # the worker list could not be read
    READINESS_UNKNOWN = "readiness_unknown"  # no reconcile pass yet: nothing was changed


class GatewaySyncObserver(Protocol):
    """Where gateway sync reports what metrics count (the root implements it with Prometheus)."""

    def sync_finished(self, outcome: str, seconds: float) -> None: ...

    def worker_changed(self, box_id: str, action: str, ok: bool) -> None:
        """`action` is register or deregister."""
        ...

    def workers_listed(self, ours: int, foreign: int) -> None:
        """Workers the router listed at the start of the pass: our boxes, and others we leave alone."""
        ...


class NullGatewaySyncObserver:
    def sync_finished(self, outcome: str, seconds: float) -> None:
        return None

    def worker_changed(self, box_id: str, action: str, ok: bool) -> None:
        return None

    def workers_listed(self, ours: int, foreign: int) -> None:
        return None


@dataclass(frozen=True, slots=True)
class SyncReport:
    """What one pass did."""

    outcome: SyncOutcome
    registered: tuple[str, ...] = ()  # box ids added in this pass
    deregistered: tuple[str, ...] = ()  # box ids removed in this pass
    failed: tuple[str, ...] = ()  # "box: error" for each add/remove that failed
    foreign_workers: tuple[str, ...] = ()  # listed URLs that are none of our boxes (left alone)
    error: str | None = None  # why the worker list could not be read


def normalized_url(url: str) -> str:
    """URLs compare without surrounding blanks or a trailing slash (as the gateway adapter reports them)."""
    return url.strip().rstrip("/")


class GatewaySync:
    """Keeps the router's worker list equal to the ready boxes of our fleet. `run(stopping)` is the root
    task; `sync_once()` is one pass (tests and tools call it directly)."""

    def __init__(
        self,
        *,
        gateway: GatewayPort,
        fleet: Callable[[], Sequence[BoxSpec]],
        readiness: ReadinessSource,
        clock: Clock,
        interval_seconds: float,
        observer: GatewaySyncObserver | None = None,
    ) -> None:
        if interval_seconds <= 0:
            raise ValueError("interval_seconds must be > 0")
        self._fleet = fleet
        self._by_url: dict[str, BoxSpec] = {}  # every box URL of the fleet seen by this process
        self._gateway = gateway
        self._readiness = readiness
        self._clock = clock
        self._interval = interval_seconds
        self._observer: GatewaySyncObserver = observer or NullGatewaySyncObserver()
        self._log = structlog.stdlib.get_logger(__name__)
        self._last_ready: set[str] | None = None
        self._last_outcome: SyncOutcome | None = None
        self._passes = 0

    @property
    def passes(self) -> int:
        return self._passes

    async def sync_once(self) -> SyncReport:
        """One level-triggered pass: read the router's list, remove what is not ready, add what is."""
        started = self._clock.monotonic()
        for box in self._fleet():
            self._by_url[normalized_url(box.base_url)] = box
        ready = self._readiness.ready_box_ids()
        self._last_ready = None if ready is None else set(ready)
        if ready is None:
            return self._finish(SyncReport(SyncOutcome.READINESS_UNKNOWN), started)
        try:
            workers = {normalized_url(url): usable for url, usable in (await self._gateway.listing()).items()}
        except WarmerError as exc:
            report = SyncReport(SyncOutcome.GATEWAY_UNAVAILABLE, error=f"{type(exc).__name__}: {exc}")
            return self._finish(report, started)
        listed = set(workers)
        ours = {url: box for url, box in self._by_url.items() if url in listed}
        foreign = tuple(sorted(listed - self._by_url.keys()))
        self._observer.workers_listed(len(ours), len(foreign))

        leaving = [box for box in ours.values() if box.id not in ready]
        removal = await asyncio.gather(*(self._change(box, register=False) for box in leaving))
        # Readiness may have moved while we removed: only add what is still ready now.
        ready_now = self._readiness.ready_box_ids() or set()
        joining = [
            box
            for url, box in self._by_url.items()
            if box.id in ready_now and not workers.get(url, False)  # not listed, or listed unusable
        ]
        adding = await asyncio.gather(*(self._change(box, register=True) for box in joining))

        failed = tuple(error for error in (*removal, *adding) if error is not None)
        report = SyncReport(
            outcome=SyncOutcome.PARTIAL if failed else SyncOutcome.OK,
            registered=tuple(box.id for box, error in zip(joining, adding, strict=True) if error is None),
            deregistered=tuple(box.id for box, error in zip(leaving, removal, strict=True) if error is None),
            failed=failed,
            foreign_workers=foreign,
        )
        return self._finish(report, started)

    async def _change(self, box: BoxSpec, *, register: bool) -> str | None:
        with structlog.contextvars.bound_contextvars(box=box.id):
            return await self._change_worker(box, register=register)

    async def _change_worker(self, box: BoxSpec, *, register: bool) -> str | None:
        """Add or remove one worker; returns the error text instead of raising (the pass goes on)."""
        action = "register" if register else "deregister"
        try:
            if register:
                await self._gateway.register(box)
            else:
                await self._gateway.deregister(box)
        except WarmerError as exc:
            error = f"{type(exc).__name__}: {exc}"
            self._observer.worker_changed(box.id, action, False)
            self._log.warning(f"gateway {action} failed", box=box.id, url=box.base_url, error=error)
            return f"{box.id}: {error}"
        self._observer.worker_changed(box.id, action, True)
        verb = "now routes to" if register else "no longer routes to"
        self._log.info(f"gateway {verb} box", box=box.id, url=box.base_url, action=action)
        return None

    def _finish(self, report: SyncReport, started: float) -> SyncReport:
        self._passes += 1
        self._observer.sync_finished(report.outcome.value, max(0.0, self._clock.monotonic() - started))
        if report.outcome is SyncOutcome.GATEWAY_UNAVAILABLE:
            # Logged once per outage, not every pass; the counter shows how long it lasts.
            if self._last_outcome is not SyncOutcome.GATEWAY_UNAVAILABLE:
                self._log.error("gateway unreachable: worker list unknown, retrying", error=report.error)
        elif self._last_outcome is SyncOutcome.GATEWAY_UNAVAILABLE:
            self._log.info("gateway reachable again")
        self._last_outcome = report.outcome
        return report

    async def run(self, stopping: asyncio.Event) -> None:
        """The root task: a pass now, then every interval and whenever the ready set changes."""
        stop_waiter: asyncio.Future[Any] = asyncio.ensure_future(stopping.wait())
        try:
            while not stopping.is_set():
                await self.sync_once()
                await self._wait_for_reason(stop_waiter)
        finally:
            stop_waiter.cancel()

    async def _wait_for_reason(self, stop_waiter: asyncio.Future[Any]) -> None:
        """Until the interval has passed, the ready set differs from the last pass, or a stop is asked."""
        timer: asyncio.Future[Any] = asyncio.ensure_future(self._clock.sleep(self._interval))
        try:
            while not timer.done() and not stop_waiter.done():
                if self._readiness.ready_box_ids() != self._last_ready:
                    return
                change: asyncio.Future[Any] = asyncio.ensure_future(self._readiness.wait_changed())
                try:
                    await asyncio.wait({timer, stop_waiter, change}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    change.cancel()
        finally:
            timer.cancel()
