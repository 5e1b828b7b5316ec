"""Wiring of gateway sync and the hit-rate monitor: settings -> services, over the running reconciler.

The reconciler is a root task of its own and exists only while it runs, so gateway sync and the monitor
reach it through small adapters that look it up on every call: before the reconciler's first pass
readiness is "not known" (gateway sync then changes nothing), and a suspect verdict with no reconciler
running is simply dropped (the next verdict arrives with the next window).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import httpx

from warmer.adapters.gateway.sglang_router import SglangRouterGateway
from warmer.config.fleet_settings import GatewaySettings
from warmer.config.settings import Settings
from warmer.core.model import BoxSpec
from warmer.service.hitrate_monitor import HitRateConfig
from warmer.service.reconciler import Reconciler

# Bound on waiting for one add/remove to show in the router's list. Short: removals of the next pass wait
# behind this pass, and an add that has not shown by then is simply seen (or retried) by the next pass.
GATEWAY_SETTLE_SECONDS = 10.0
GATEWAY_REQUEST_TIMEOUT_SECONDS = 5.0
# While the reconciler is not running, how often gateway sync looks again for a readiness change.
READINESS_RECHECK_SECONDS = 0.5

ReconcilerLookup = Callable[[], Reconciler | None]


def build_gateway(gateway: GatewaySettings, http: httpx.AsyncClient) -> SglangRouterGateway:
    """The router adapter for `[fleet.gateway]` over the daemon's shared HTTP client."""
    return SglangRouterGateway(
        http,
        gateway.url,
        api_style=gateway.api_style,
        request_timeout=GATEWAY_REQUEST_TIMEOUT_SECONDS,
        settle_timeout=GATEWAY_SETTLE_SECONDS,
    )


def hitrate_config(settings: Settings) -> HitRateConfig:
    """The monitor's knobs from `[hitrate]`."""
    section = settings.hitrate
    return HitRateConfig(
        poll_seconds=section.poll_seconds,
        threshold=section.threshold,
        min_tokens_per_window=float(section.min_tokens_per_window),
    )


class CurrentFleet:
    """The running reconciler's fleet (boxes come and go with deploy events); the configured boxes while
    it is not running. `also` is told each answer (an engine dispatcher limited to the fleet's boxes)."""

    def __init__(
        self,
        lookup: ReconcilerLookup,
        configured: Sequence[BoxSpec],
        also: Callable[[Sequence[BoxSpec]], None] | None = None,
    ) -> None:
        self._lookup = lookup
        self._configured = tuple(configured)
        self._also = also

    def __call__(self) -> Sequence[BoxSpec]:
        reconciler = self._lookup()
        boxes = self._configured if reconciler is None else tuple(reconciler.snapshot().boxes.values())
        if self._also is not None:
            self._also(boxes)
        return boxes


class ReconcilerReadiness:
    """Gateway sync's `ReadinessSource` over whichever reconciler is running now."""

    def __init__(self, lookup: ReconcilerLookup) -> None:
        self._lookup = lookup

    def ready_box_ids(self) -> set[str] | None:
        reconciler = self._lookup()
        return None if reconciler is None else reconciler.ready_box_ids()

    async def wait_changed(self) -> None:
        reconciler = self._lookup()
        if reconciler is None:
            await asyncio.sleep(READINESS_RECHECK_SECONDS)
            return
        await reconciler.wait_changed()


class ReconcilerSuspects:
    """The hit-rate monitor's `SuspectSink`: forwards verdicts to the running reconciler."""

    def __init__(self, lookup: ReconcilerLookup) -> None:
        self._lookup = lookup

    def set_suspect(self, box_id: str, suspect: bool) -> None:
        reconciler = self._lookup()
        if reconciler is not None:
            reconciler.set_suspect(box_id, suspect)
