"""Wiring of `[fleet.discovery]`: the Kubernetes pod watch over its own API client (the API server's CA and
the service-account token), feeding the reconciler's fleet."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

from lightkube import AsyncClient

from warmer.adapters.discovery import KubernetesPods, PodTemplate, api_client
from warmer.config.fleet_settings import KubernetesDiscoverySettings
from warmer.core.model import BoxSpec, ModelProfile
from warmer.root.engines import SystemClock
from warmer.service.fleet.discovery import DiscoveryObserver, FleetDiscovery, FleetEditor


def pod_source(
    discovery: KubernetesDiscoverySettings, profiles: Mapping[str, ModelProfile], client: AsyncClient
) -> KubernetesPods:
    profile = profiles.get(discovery.model)
    slots = discovery.slots if discovery.slots is not None else (profile.slots if profile is not None else 1)
    return KubernetesPods(
        client,
        namespace=discovery.namespace,
        label_selector=discovery.label_selector,
        template=PodTemplate(
            engine=discovery.engine,
            model=discovery.model,
            port=discovery.port,
            scheme=discovery.scheme,
            slots=slots,
            group=discovery.group,
        ),
    )


async def run_discovery(
    discovery: KubernetesDiscoverySettings,
    profiles: Mapping[str, ModelProfile],
    fleet: FleetEditor,
    on_fleet_change: Callable[[Sequence[BoxSpec]], None],
    observer: DiscoveryObserver,
    stopping: asyncio.Event,
) -> None:
    """The `discovery` root task."""
    client = api_client(
        discovery.api_url,
        token_file=discovery.token_file,
        ca_file=discovery.ca_file,
        namespace=discovery.namespace,
    )
    async with client:  # its connections are closed when the task stops
        await FleetDiscovery(
            source=pod_source(discovery, profiles, client),
            fleet=fleet,
            clock=SystemClock(),
            interval_seconds=discovery.interval_seconds,
            on_fleet_change=on_fleet_change,
            observer=observer,
        ).run(stopping)
