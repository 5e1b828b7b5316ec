"""Boxes, readiness and routes: `GET /v1/boxes`, `/v1/boxes/{id}`, `/v1/boxes/{id}/ready`, `/v1/routes`.

`/v1/boxes/{id}/ready` answers 200 or 503 with a JSON reason and needs no token, so a gateway health check
or a Kubernetes readiness probe can point at it directly (it reveals only ready/not ready and why). The
others are ops views behind the bearer token. Thin shell: every answer is `warmer.service.status`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from warmer.api.auth import require_token
from warmer.api.schemas import (
    UNAUTHORIZED,
    UNAVAILABLE,
    BoxList,
    BoxReadiness,
    Problem,
    RouteTable,
    described,
    unavailable,
)
from warmer.api.services import ApiServices
from warmer.api.storeerrors import store_problem
from warmer.core.errors import StoreError
from warmer.service.status import BoxView, StatusQueries, StatusUnavailable


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value)


def router(services: ApiServices) -> APIRouter:
    routes = APIRouter(tags=["boxes"])
    protected = [Depends(require_token(services))]

    def queries() -> StatusQueries:
        if services.status is None:
            raise StatusUnavailable("box status is not available")
        return services.status

    @routes.get(
        "/v1/boxes",
        summary="Every box: health, epoch, restart phases, prefixes, readiness, weight",
        dependencies=protected,
        responses={200: described(BoxList, "Every box"), **UNAUTHORIZED, **UNAVAILABLE},
    )
    async def list_boxes() -> JSONResponse:
        try:
            boxes = await queries().boxes()
        except StatusUnavailable as exc:
            return unavailable(str(exc))
        return JSONResponse({"boxes": [_plain(box) for box in boxes]})

    @routes.get(
        "/v1/boxes/{box_id}",
        summary="One box (404 when the fleet has no such box)",
        dependencies=protected,
        responses={
            200: described(BoxView, "The box"),
            404: described(Problem, "Unknown box"),
            **UNAUTHORIZED,
            **UNAVAILABLE,
        },
    )
    async def get_box(box_id: str) -> JSONResponse:
        try:
            box = await queries().box(box_id)
        except StatusUnavailable as exc:
            return unavailable(str(exc))
        if box is None:
            return JSONResponse({"error": "not_found", "detail": f"unknown box {box_id!r}"}, 404)
        return JSONResponse(_plain(box))

    @routes.get(
        "/v1/boxes/{box_id}/ready",
        summary="200 when the box is ready (restart warm-up done, every assigned prefix verified warm); "
        "503 with the reasons otherwise. No token: usable as a gateway health check or readiness probe.",
        responses={
            200: described(BoxReadiness, "Ready"),
            404: described(BoxReadiness, "Unknown box"),
            503: described(BoxReadiness, "Not ready; `reasons` say why"),
        },
    )
    async def box_ready(box_id: str) -> JSONResponse:
        try:
            ready = await queries().ready(box_id)
        except StatusUnavailable as exc:
            return JSONResponse({"box": box_id, "ready": False, "reasons": [str(exc)]}, 503)
        except StoreError as exc:  # fail closed: a box whose state cannot be read is not ready
            return JSONResponse({"box": box_id, "ready": False, "reasons": [store_problem(exc)]}, 503)
        if ready is None:
            return JSONResponse({"box": box_id, "ready": False, "reasons": ["unknown box"]}, 404)
        body = {"box": box_id, "ready": ready.ready, "reasons": list(ready.reasons), "since": ready.since,
                "weight": ready.weight}  # fmt: skip
        return JSONResponse(body, 200 if ready.ready else 503)

    @routes.get(
        "/v1/routes",
        summary="Per agent: boxes where ITS prefix is verified warm, ramp weights",
        dependencies=protected,
        responses={
            200: described(RouteTable, "Routes per agent"),
            **UNAUTHORIZED,
            **UNAVAILABLE,
        },
    )
    async def list_routes() -> JSONResponse:
        try:
            found = await queries().routes()
        except StatusUnavailable as exc:
            return unavailable(str(exc))
        return JSONResponse({"routes": {agent.agent_id: _plain(agent) for agent in found}})

    return routes
