"""Liveness, readiness and metrics: the routes every deployment probes."""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from warmer.api.schemas import Health, NotReady, Ready, Stalled, described
from warmer.api.services import ApiServices


def router(services: ApiServices) -> APIRouter:
    routes = APIRouter(tags=["health"])

    @routes.get(
        "/healthz",
        summary="Liveness: the process serves HTTP and its reconcile loop finished a pass recently",
        responses={
            200: described(Health, "Alive"),
            503: described(Stalled, "A loop is stuck; `reason` says which and for how long"),
        },
    )
    async def healthz() -> JSONResponse:
        try:
            liveness = services.liveness()
        except Exception as exc:  # a liveness probe must answer; a broken check is not a wedged loop
            return JSONResponse({"status": "ok", "note": f"liveness check failed: {exc}"})
        if liveness.alive:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "stalled", "reason": liveness.reason}, 503)

    @routes.get(
        "/readyz",
        summary="Readiness: the daemon is started and its database reachable (503 with a reason otherwise)",
        responses={
            200: described(Ready, "Ready"),
            503: described(NotReady, "Not ready; `reason` says why"),
        },
    )
    async def readyz() -> JSONResponse:
        try:
            readiness = await services.readiness()
        except Exception as exc:  # a readiness probe must answer, whatever broke
            return JSONResponse({"status": "not ready", "reason": f"readiness check failed: {exc}"}, 503)
        if readiness.ready:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "not ready", "reason": readiness.reason}, 503)

    @routes.get("/metrics", summary="Prometheus metrics of this daemon", response_class=Response)
    async def metrics() -> Response:
        # warmer_ready follows the daemon, not only the last /readyz probe: each scrape re-checks it.
        with contextlib.suppress(Exception):  # a scrape must answer, whatever broke
            await services.readiness()
        return Response(generate_latest(services.registry), media_type=CONTENT_TYPE_LATEST)

    return routes
