"""Wiring of the deploy webhook: settings -> `WebhookConfig`, and a `DeployService` over the store and the
reconciler."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from warmer.config.settings import Settings
from warmer.core.model import BoxSpec
from warmer.ports import Clock, CoordinationPort, StorePort
from warmer.service.fleet.deploy import DeployService, FleetControl, WebhookConfig


def webhook_config(settings: Settings) -> WebhookConfig:
    api = settings.api
    return WebhookConfig(
        secrets=tuple(api.webhook_secrets()),
        tolerance_seconds=api.webhook_tolerance_seconds,
        box_url_policy=api.box_url_policy(),
    )


def build_deploy_service(
    settings: Settings,
    *,
    store: StorePort,
    fleet: FleetControl,
    clock: Clock,
    on_fleet_change: Callable[[Sequence[BoxSpec]], None] | None = None,
    shared: CoordinationPort | None = None,
) -> DeployService:
    return DeployService(
        store=store,
        clock=clock,
        config=webhook_config(settings),
        fleet=fleet,
        on_fleet_change=on_fleet_change,
        shared=shared,
    )
