"""What the HTTP API needs from the daemon, as plain values and callables.

The API never builds or owns these: the composition root (`warmer.root.app`) hands them over. A feature
that needs more (box queries, prewarm, campaigns) adds a field here with a default and a router module;
the web framework wiring in `app.py` stays as it is.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from opentelemetry.trace import TracerProvider
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

import warmer
from warmer.api.observe import RequestObserver
from warmer.config.server_settings import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_WEBHOOK_MAX_BODY_BYTES
from warmer.service.dialer.campaigns import CampaignService
from warmer.service.dialer.prewarm import PrewarmService
from warmer.service.dialer.usage import UsageService
from warmer.service.fleet.deploy import DeployHandler
from warmer.service.views.capacity import CapacityReport
from warmer.service.views.status import StatusQueries


@dataclass(frozen=True, slots=True)
class Readiness:
    """Whether the daemon can do its job now; `reason` says why not (shown in /readyz)."""

    ready: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Liveness:
    """Whether the daemon's loops make progress; `reason` says what is stuck (shown in /healthz)."""

    alive: bool
    reason: str = ""


def always_alive() -> Liveness:
    return Liveness(True)


class CapacityQueries(Protocol):
    """What `GET /v1/capacity` asks (`warmer.service.views.capacity.CapacityService` answers)."""

    async def report(self) -> CapacityReport: ...


@dataclass(frozen=True, slots=True)
class ApiServices:
    """Everything the API routes call. Build one per app; tests build it from fakes."""

    registry: CollectorRegistry  # this daemon's metrics, rendered by /metrics
    readiness: Callable[[], Awaitable[Readiness]]  # must not raise; answers /readyz
    tokens: tuple[SecretStr, ...] = ()  # bearer tokens for protected routes; empty = open (loopback only)
    version: str = warmer.__version__
    status: StatusQueries | None = None  # boxes, readiness and routes (GET /v1/boxes..., /v1/routes)
    prewarm: PrewarmService | None = None  # dialer pre-call ask (POST /v1/prewarm)
    campaigns: CampaignService | None = None  # dialer schedule (PUT/DELETE/GET /v1/campaigns)
    deploy: DeployHandler | None = None  # signed deploy webhook (POST /v1/events/deploy)
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # prewarm and campaign bodies; bigger is 413
    webhook_max_body_bytes: int = DEFAULT_WEBHOOK_MAX_BODY_BYTES  # deploy webhook bodies; bigger is 413
    capacity: CapacityQueries | None = None  # prefill budget per agent group (GET /v1/capacity)
    requests: RequestObserver | None = None  # every request by route template (warmer_http_requests)
    liveness: Callable[[], Liveness] = always_alive  # must not raise; answers /healthz
    tracer_provider: TracerProvider | None = None  # traces every request when set (`[tracing]`)
    usage: UsageService | None = None  # per-turn usage reports and turn 1 over them (POST/GET /v1/usage)
