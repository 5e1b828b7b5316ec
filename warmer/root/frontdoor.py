"""Wiring of gateway sync and the hit-rate monitor: settings -> the router adapter and the monitor's knobs."""

from __future__ import annotations

import httpx

from warmer.adapters.gateway.sglang_router import SglangRouterGateway
from warmer.config.fleet_settings import GatewaySettings
from warmer.config.settings import Settings
from warmer.service.engine_signals.hitrate_monitor import HitRateConfig

# Bound on waiting for one add/remove to show in the router's list. Short: removals of the next pass wait
# behind this pass, and an add that has not shown by then is simply seen (or retried) by the next pass.
GATEWAY_SETTLE_SECONDS = 10.0
GATEWAY_REQUEST_TIMEOUT_SECONDS = 5.0


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
