"""Per-box cache hit rate from the engines' own counters, with a threshold alert.

Hit rate is capacity: a box whose warm prefixes were evicted serves the same calls with
several times the prefill work. So every `poll_seconds` each box's cumulative cache counters are scraped
(`EnginePort.cache_stats`) and the rate over the traffic between two scrapes is judged
(`warmer.core.hitrate`):

* fewer than `min_tokens_per_window` prompt tokens in the window: no judgement (an idle box with a few
  health checks or probes must not alert), and an alert still raised is cleared: a box that serves no
  calls wastes no prefill, and a stale alert on it would only page someone for nothing;
* counters went down (the engine restarted): the window is only a new baseline. The traffic since a
  restart is dominated by the restart warm-up, which is cold by design; the alert of the old process is
  cleared (the reconciler re-warms the new one and keeps it out of routes until verified);
* below the threshold: the box alerts. A structured log event is written once per crossing (not every
  pass), the alert gauge goes to 1, and the box is reported as suspect, so the reconciler probes its warm
  prefixes (an eviction shows up there as a cold probe and a re-warm); back at or above: cleared, logged.

* the box was not ready for traffic at either end of the window (given `ready_boxes`): no judgement and
  the alert state stays as it was. Such a window holds warmer's own traffic, a restart warm-up (cold by
  design) or the first warm of a prefix (one cold prefill each), which says nothing about the calls.

A scrape failure is logged once per streak and counted; it never ends the daemon.

The same windows give each box's uncached prompt tokens per second (`uncached_rates()`), which the
capacity figures read instead of scraping the engines a second time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from warmer.core.capacity import UncachedRate, uncached_rate_between
from warmer.core.errors import NotSupported, WarmerError
from warmer.core.hitrate import (
    DEFAULT_HIT_RATE_THRESHOLD,
    HitRateStatus,
    check_hit_rate,
    hit_rate_between,
)
from warmer.core.model import BoxSpec, CacheStats
from warmer.ports import Clock, EnginePort
from warmer.service.paced import gather_paced
from warmer.service.periodic import every_period

EVENT_BELOW = "box hit rate below threshold"
EVENT_RECOVERED = "box hit rate recovered"


class SuspectSink(Protocol):
    """Told which boxes' hit rate says something was evicted (the reconciler probes their prefixes)."""

    def set_suspect(self, box_id: str, suspect: bool) -> None: ...


class HitRateObserver(Protocol):
    """Where the monitor reports what metrics show (the root implements it with Prometheus)."""

    def hit_ratio(self, box_id: str, ratio: float) -> None:
        """The box's hit ratio over the last judged window."""
        ...

    def alert(self, box_id: str, below_threshold: bool) -> None: ...

    def window_tokens(self, box_id: str, queried_tokens: float, hit_tokens: float) -> None:
        """Prompt tokens the engine reported between two scrapes of one process (every window, judged
        or not), and how many of them came from its prefix cache."""
        ...

    def scrape_finished(self, box_id: str, outcome: str) -> None:
        """`outcome`: ok, failed, unsupported."""
        ...


class NullHitRateObserver:
    def hit_ratio(self, box_id: str, ratio: float) -> None:
        return None

    def alert(self, box_id: str, below_threshold: bool) -> None:
        return None

    def window_tokens(self, box_id: str, queried_tokens: float, hit_tokens: float) -> None:
        return None

    def scrape_finished(self, box_id: str, outcome: str) -> None:
        return None


@dataclass(frozen=True, slots=True)
class HitRateConfig:
    poll_seconds: float = 60.0
    threshold: float = DEFAULT_HIT_RATE_THRESHOLD
    min_tokens_per_window: float = 10000.0
    scrape_concurrency: int = 16

    def __post_init__(self) -> None:
        if self.poll_seconds <= 0:
            raise ValueError("poll_seconds must be > 0")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError("threshold must be within [0, 1]")
        if self.min_tokens_per_window < 0:
            raise ValueError("min_tokens_per_window must be >= 0")
        if self.scrape_concurrency < 1:
            raise ValueError("scrape_concurrency must be >= 1")


@dataclass(frozen=True, slots=True)
class BoxHitRate:
    """The monitor's view of one box after a scrape."""

    box_id: str
    status: HitRateStatus
    hit_rate: float | None  # of the last window (None: no traffic, first scrape, or a restart)
    queried_tokens: float | None  # in the last window
    alerting: bool
    counters_reset: bool = False
    error: str | None = None  # the scrape failed (the previous baseline is kept)


@dataclass(slots=True)
class _BoxState:
    baseline: CacheStats | None = None
    baseline_at: float = 0.0  # monotonic seconds of the baseline scrape
    uncached: UncachedRate | None = None  # of the last window
    alerting: bool = False
    failing: bool = False
    unsupported: bool = False
    ready_at_baseline: bool = True


class HitRateMonitor:
    """Scrapes every box's cache counters on a timer and raises/clears the per-box alert."""

    def __init__(
        self,
        *,
        engine: EnginePort,
        fleet: Callable[[], Sequence[BoxSpec]],
        clock: Clock,
        config: HitRateConfig | None = None,
        observer: HitRateObserver | None = None,
        suspects: SuspectSink | None = None,
        ready_boxes: Callable[[], set[str] | None] | None = None,
    ) -> None:
        """`ready_boxes`: the boxes ready for traffic now (None: not known yet); windows of a box that was
        not ready at either end are not judged. Without it every window is judged."""
        self._engine = engine
        self._fleet = fleet  # read every pass: boxes may be added or removed while the daemon runs
        self._clock = clock
        self._config = config or HitRateConfig()
        self._observer: HitRateObserver = observer or NullHitRateObserver()
        self._suspects = suspects
        self._ready_boxes = ready_boxes
        self._ready_now: Collection[str] | None = None  # this scrape round's ready boxes
        self._state: dict[str, _BoxState] = {}
        self._log = structlog.stdlib.get_logger(__name__)

    def alerting(self) -> set[str]:
        """Boxes whose last judged window was below the threshold."""
        return {box_id for box_id, state in self._state.items() if state.alerting}

    def uncached_rates(self) -> dict[str, UncachedRate]:
        """Per box, uncached prompt tokens/s over its last window between two scrapes (boxes without
        counters, or whose engine just restarted, have none)."""
        return {box_id: s.uncached for box_id, s in self._state.items() if s.uncached is not None}

    async def scrape_once(self) -> dict[str, BoxHitRate]:
        """Scrape every box (bounded concurrency) and judge the window since its previous scrape."""
        limit = asyncio.Semaphore(self._config.scrape_concurrency)

        async def one(box: BoxSpec) -> BoxHitRate:
            async with limit:
                return await self._scrape_box(box)

        boxes = list(self._fleet())
        self._ready_now = None  # read once this round, at the first answer (`_is_ready`)
        for gone in self._state.keys() - {box.id for box in boxes}:
            if self._state.pop(gone).alerting:
                self._observer.alert(gone, False)
        results = await gather_paced(one, boxes)
        return {result.box_id: result for result in results}

    async def _scrape_box(self, box: BoxSpec) -> BoxHitRate:
        with structlog.contextvars.bound_contextvars(box=box.id):
            return await self._scrape_and_judge(box)

    async def _scrape_and_judge(self, box: BoxSpec) -> BoxHitRate:
        state = self._state.setdefault(box.id, _BoxState())
        try:
            stats = await self._engine.cache_stats(box)
        except NotSupported as exc:
            self._observer.scrape_finished(box.id, "unsupported")
            if not state.unsupported:
                self._log.warning("box has no cache counters: no hit rate", box=box.id, error=str(exc))
            state.unsupported = True
            return BoxHitRate(box.id, HitRateStatus.NO_DATA, None, None, state.alerting, error=str(exc))
        except WarmerError as exc:
            self._observer.scrape_finished(box.id, "failed")
            if not state.failing:
                self._log.warning(
                    "cache counter scrape failed", box=box.id, error=f"{type(exc).__name__}: {exc}"
                )
            state.failing = True
            return BoxHitRate(box.id, HitRateStatus.NO_DATA, None, None, state.alerting, error=str(exc))
        self._observer.scrape_finished(box.id, "ok")
        state.failing = state.unsupported = False
        scraped_at = self._clock.monotonic()
        baseline, state.baseline = state.baseline, stats
        ready_before, state.ready_at_baseline = state.ready_at_baseline, self._is_ready(box.id)
        baseline_at, state.baseline_at = state.baseline_at, scraped_at
        if baseline is None:
            return BoxHitRate(box.id, HitRateStatus.NO_DATA, None, None, state.alerting)
        state.uncached = uncached_rate_between(baseline, baseline_at, stats, scraped_at)
        window = hit_rate_between(baseline, stats)
        if window.counters_reset:
            if state.alerting:
                self._set_alert(box, state, False, None, None, why="engine restarted")
            return BoxHitRate(box.id, HitRateStatus.NO_DATA, None, None, False, counters_reset=True)
        if window.queried_tokens is not None and window.hit_tokens is not None:
            self._observer.window_tokens(box.id, window.queried_tokens, window.hit_tokens)
        if not (ready_before and state.ready_at_baseline):  # warmer's own warm-up traffic: not the calls'
            return BoxHitRate(
                box.id, HitRateStatus.NO_DATA, window.hit_rate, window.queried_tokens, state.alerting
            )
        check = check_hit_rate(
            window, threshold=self._config.threshold, min_queried_tokens=self._config.min_tokens_per_window
        )
        if check.status is not HitRateStatus.NO_DATA and check.hit_rate is not None:
            self._observer.hit_ratio(box.id, check.hit_rate)
            below = check.status is HitRateStatus.BELOW_THRESHOLD
            if below != state.alerting:
                self._set_alert(box, state, below, check.hit_rate, window.queried_tokens, why="window judged")
        elif state.alerting:
            self._set_alert(
                box, state, False, None, window.queried_tokens, why="idle: too little traffic to judge"
            )
        return BoxHitRate(box.id, check.status, window.hit_rate, window.queried_tokens, state.alerting)

    def _is_ready(self, box_id: str) -> bool:
        """Ready as of this round's first answer: the fleet's readiness is computed once a round, not once
        a box (each computation looks at every box)."""
        if self._ready_boxes is None:
            return True
        if self._ready_now is None:
            self._ready_now = self._ready_boxes() or frozenset()
        return box_id in self._ready_now

    def _set_alert(
        self,
        box: BoxSpec,
        state: _BoxState,
        below: bool,
        ratio: float | None,
        queried_tokens: float | None,
        *,
        why: str,
    ) -> None:
        """A crossing: log it once, flip the gauge, tell the reconciler."""
        state.alerting = below
        self._observer.alert(box.id, below)
        if self._suspects is not None:
            self._suspects.set_suspect(box.id, below)
        fields = {
            "box": box.id,
            "hit_rate": None if ratio is None else round(ratio, 4),
            "threshold": self._config.threshold,
            "queried_tokens": queried_tokens,
            "reason": why,
        }
        if below:
            self._log.warning(EVENT_BELOW, **fields)
        else:
            self._log.info(EVENT_RECOVERED, **fields)

    async def run(self, stopping: asyncio.Event) -> None:
        """The root task: scrape now and every `poll_seconds` until asked to stop."""
        await every_period(self.scrape_once, self._clock, self._config.poll_seconds, stopping)
