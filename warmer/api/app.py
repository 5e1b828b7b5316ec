"""`create_app(services)`: the FastAPI application. A factory, never a module-level app.

Feature routes live in their own modules, each exposing `router(services) -> APIRouter`; adding one is
one entry in `ROUTER_FACTORIES`.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, FastAPI

from warmer.api import boxes, campaigns, capacity, deploy, health, prewarm
from warmer.api.services import ApiServices, Readiness
from warmer.api.storeerrors import store_unavailable
from warmer.core.errors import StoreError

ROUTER_FACTORIES: tuple[Callable[[ApiServices], APIRouter], ...] = (
    health.router,
    boxes.router,
    prewarm.router,
    campaigns.router,
    capacity.router,
    deploy.router,
)


def create_app(services: ApiServices) -> FastAPI:
    """A new app over `services`; OpenAPI at /openapi.json, docs at /docs."""
    app = FastAPI(
        title="warmer",
        version=services.version,
        summary="Keeps LLM prompt prefixes warm in engine KV caches; traffic reaches a box once it is warm.",
    )
    for factory in ROUTER_FACTORIES:
        app.include_router(factory(services))
    app.add_exception_handler(StoreError, store_unavailable)
    return app


__all__ = ["ApiServices", "Readiness", "create_app"]
