"""`create_app(services)`: the FastAPI application. A factory, never a module-level app.

Feature routes live in their own modules, each exposing `router(services) -> APIRouter`; adding one is
one entry in `ROUTER_FACTORIES`.

The pre-call ask is asked before every call a dialer places, thousands of times a second, so it does not
go through FastAPI's stack: `WarmerApi` hands it to the pre-call front door (`warmer.api.prewarm`) before
FastAPI's own entry point runs, and every other request to FastAPI. Request metrics wrap both.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, FastAPI
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from warmer.api import boxes, campaigns, capacity, deploy, health, prewarm, side_slots, usage
from warmer.api.observe import RequestMetricsMiddleware
from warmer.api.services import ApiServices, Liveness, Readiness
from warmer.api.storeerrors import store_unavailable
from warmer.core.errors import StoreError

# Routes whose requests make no span: liveness and readiness probes and metric scrapes, every few seconds.
UNTRACED = "/healthz,/readyz,/metrics"

ROUTER_FACTORIES: tuple[Callable[[ApiServices], APIRouter], ...] = (
    health.router,
    boxes.router,
    prewarm.router,
    side_slots.router,
    campaigns.router,
    capacity.router,
    usage.router,
    deploy.router,
)


class WarmerApi(FastAPI):
    """FastAPI behind the pre-call front door, both inside the request metrics.

    FastAPI's entry point alone (its telemetry check, error and body-limit middlewares, routing among every
    route, dependency solving) costs more per ask than the pre-call service itself."""

    def __init__(self, services: ApiServices, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._services = services
        self._entry: ASGIApp | None = None

    async def _framework(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)

    def _build_entry(self) -> ASGIApp:
        framework: ASGIApp = self._framework
        observer = self._services.requests
        if observer is not None:
            framework = RequestMetricsMiddleware(framework, observer)
        entry: ASGIApp = prewarm.PrewarmFrontDoor(framework, prewarm.PrewarmHandler(self._services), observer)
        provider = self._services.tracer_provider
        if provider is not None:
            # Outermost, so the pre-call front door is traced too; probes and scrapes make no spans.
            entry = OpenTelemetryMiddleware(entry, excluded_urls=UNTRACED, tracer_provider=provider)
        return entry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        entry = self._entry
        if entry is None:
            entry = self._entry = self._build_entry()
        await entry(scope, receive, send)


def create_app(services: ApiServices) -> FastAPI:
    """A new app over `services`; OpenAPI at /openapi.json, docs at /docs."""
    app = WarmerApi(
        services,
        title="warmer",
        version=services.version,
        summary="Keeps LLM prompt prefixes warm in engine KV caches; traffic reaches a box once it is warm.",
    )
    for factory in ROUTER_FACTORIES:
        app.include_router(factory(services))
    app.add_exception_handler(StoreError, store_unavailable)
    return app


__all__ = ["ApiServices", "Liveness", "Readiness", "WarmerApi", "create_app"]
