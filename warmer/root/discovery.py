"""Wiring of `[fleet.discovery]`: the Kubernetes pod lister over its own HTTP client (the API server's
CA and the service-account token), feeding the reconciler's fleet."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx

from warmer.adapters.discovery import KubernetesPods, PodTemplate
from warmer.config.fleet_settings import KubernetesDiscoverySettings
from warmer.core.model import BoxSpec, ModelProfile
from warmer.root.engines import SystemClock
from warmer.root.http import http_client
from warmer.service.discovery import DiscoveryObserver, FleetDiscovery, FleetEditor


def _token_reader(path: Path) -> Callable[[], str | None]:
    def read() -> str | None:
        try:
            return path.read_text(encoding="utf-8").strip() or None
        except OSError:
            return None  # outside a pod, or no token mounted: the API server decides

    return read


def pod_source(
    discovery: KubernetesDiscoverySettings, profiles: Mapping[str, ModelProfile], http: httpx.AsyncClient
) -> KubernetesPods:
    profile = profiles.get(discovery.model)
    slots = discovery.slots if discovery.slots is not None else (profile.slots if profile is not None else 1)
    return KubernetesPods(
        http,
        api_url=discovery.api_url,
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
        token=_token_reader(discovery.token_file),
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
    verify: str | bool = str(discovery.ca_file) if discovery.ca_file is not None else True
    async with http_client(verify=verify) as http:
        await FleetDiscovery(
            source=pod_source(discovery, profiles, http),
            fleet=fleet,
            clock=SystemClock(),
            interval_seconds=discovery.interval_seconds,
            on_fleet_change=on_fleet_change,
            observer=observer,
        ).run(stopping)
