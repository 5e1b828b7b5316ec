"""Fleet discovery: boxes found at run time (e.g. engine pods on Kubernetes) join and leave the running
fleet, next to the configured ones.

The source is watched: it gives the whole current set of boxes, then the set again after each change.
Each set is compared with the boxes this discovery added: new ones are added (the reconciler warms them
before any route uses them), vanished ones removed, and one whose address changed (a pod re-created under
the same name) is replaced. Configured boxes and boxes added by deploy events are never touched. A failed
listing or watch changes nothing (an API outage must not empty the fleet): the watch starts over with a
listing after a backoff that doubles from one second up to `interval_seconds`. After a daemon restart
the first listing brings the discovered boxes back; their warm state is re-verified like any box's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from warmer.core.errors import ConfigError, DiscoveryUnavailable
from warmer.core.model import BoxSpec
from warmer.ports import Clock

FIRST_BACKOFF_SECONDS = 1.0  # the first wait after a failed listing or watch; it doubles up to the interval


class BoxSource(Protocol):
    """Where boxes are discovered (the Kubernetes adapter implements it)."""

    async def list_boxes(self) -> Sequence[BoxSpec]: ...

    def watch_boxes(self) -> AsyncIterator[Sequence[BoxSpec]]:
        """Every box now, then the whole set again after each change; raises DiscoveryUnavailable."""
        ...


class DiscoveryObserver(Protocol):
    """Where listings are counted (the root implements it with Prometheus)."""

    def listed(self, ok: bool, boxes: int | None) -> None:
        """One listing: whether the source answered, and how many discovered boxes the fleet now has."""
        ...


class FleetEditor(Protocol):
    """The running fleet (the reconciler)."""

    def fleet(self) -> Mapping[str, BoxSpec]: ...

    async def add_box(self, box: BoxSpec) -> None: ...

    async def remove_box(self, box_id: str) -> None: ...


@dataclass(frozen=True, slots=True)
class DiscoveryReport:
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    skipped: tuple[str, ...] = field(default=())  # found, but the id is taken by another box
    error: str | None = None


class FleetDiscovery:
    def __init__(
        self,
        *,
        source: BoxSource,
        fleet: FleetEditor,
        clock: Clock,
        interval_seconds: float,
        on_fleet_change: Callable[[Sequence[BoxSpec]], None] | None = None,
        observer: DiscoveryObserver | None = None,
    ) -> None:
        if interval_seconds <= 0:
            raise ValueError("interval_seconds must be > 0")
        self._source = source
        self._fleet = fleet
        self._clock = clock
        self._interval = interval_seconds
        self._on_fleet_change = on_fleet_change
        self._observer = observer
        self._owned: dict[str, BoxSpec] = {}
        self._failing = False
        self._backoff = min(FIRST_BACKOFF_SECONDS, interval_seconds)
        self._log = structlog.stdlib.get_logger(__name__)

    @property
    def discovered(self) -> Mapping[str, BoxSpec]:
        return dict(self._owned)

    async def sync_once(self) -> DiscoveryReport:
        """One listing, applied (a one-off look: `run` watches)."""
        try:
            found = await self._source.list_boxes()
        except DiscoveryUnavailable as exc:
            return self._failed(exc)
        return await self._apply(found)

    def _failed(self, exc: DiscoveryUnavailable) -> DiscoveryReport:
        if not self._failing:
            self._log.warning("discovery failed: fleet kept as it is", error=str(exc))
        self._failing = True
        if self._observer is not None:
            self._observer.listed(False, None)
        return DiscoveryReport(error=str(exc))

    async def _apply(self, boxes: Sequence[BoxSpec]) -> DiscoveryReport:
        """Make the boxes this discovery added the `boxes` found now."""
        editor = self._fleet
        found = {box.id: box for box in boxes}
        if self._failing:
            self._log.info("discovery answers again")
        self._failing = False
        removed: list[str] = []
        for box_id, box in list(self._owned.items()):
            if found.get(box_id) != box:
                await self._remove(editor, box_id)
                removed.append(box_id)
        added, skipped = [], []
        for box_id, box in found.items():
            if box_id in self._owned:
                continue
            if box_id in editor.fleet():
                skipped.append(box_id)
                continue
            try:
                await editor.add_box(box)
            except ConfigError as exc:
                self._log.warning("discovered box refused", box=box_id, error=str(exc))
                skipped.append(box_id)
                continue
            self._owned[box_id] = box
            added.append(box_id)
            self._log.info("discovered box added", box=box_id, url=box.base_url)
        if (added or removed) and self._on_fleet_change is not None:
            self._on_fleet_change(list(editor.fleet().values()))
        if self._observer is not None:
            self._observer.listed(True, len(self._owned))
        return DiscoveryReport(tuple(added), tuple(removed), tuple(skipped))

    async def watch_once(self) -> DiscoveryReport | None:
        """Follow the source's watch until it fails: the failure's report (None if it ended cleanly)."""
        try:
            async for found in self._source.watch_boxes():
                await self._apply(found)
                self._backoff = min(FIRST_BACKOFF_SECONDS, self._interval)  # it answered: start short again
        except DiscoveryUnavailable as exc:
            return self._failed(exc)
        return None

    async def _remove(self, editor: FleetEditor, box_id: str) -> None:
        box = self._owned.pop(box_id)
        if box_id in editor.fleet():
            await editor.remove_box(box_id)
        self._log.info("discovered box removed", box=box_id, url=box.base_url)

    async def run(self, stopping: asyncio.Event) -> None:
        """The root task: watch the source; after a failure, back off (1 s doubling up to
        `interval_seconds`) and watch again from a fresh listing, until asked to stop."""
        while not stopping.is_set():
            watching = asyncio.ensure_future(self.watch_once())
            waiter = asyncio.ensure_future(stopping.wait())
            try:
                await asyncio.wait({watching, waiter}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                if not watching.done():
                    watching.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await watching
            if stopping.is_set():
                return
            await self._sleep_or_stop(self._backoff, stopping)
            self._backoff = min(self._backoff * 2, self._interval)

    async def _sleep_or_stop(self, seconds: float, stopping: asyncio.Event) -> None:
        sleeper = asyncio.ensure_future(self._clock.sleep(seconds))
        waiter = asyncio.ensure_future(stopping.wait())
        try:
            await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waiter.cancel()
