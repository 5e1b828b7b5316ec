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
    BoxAdmission,
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
        "/v1/boxes/{box_id}/admit",
        summary="The admission gate for an engine pod's readiness probe or a gateway's health check: 200 "
        "when the box is ready, or let in although not ready because holding it longer would be worse "
        "(ready earlier in this engine epoch, held past [gate] max_hold_seconds, or holding it would hold "
        "out too much of its model); 503 while it is held. `ready` in the body stays the truth. No token.",
        responses={
            200: described(BoxAdmission, "Let traffic in (`ready` and `release` say on what grounds)"),
            404: described(BoxAdmission, "Unknown box"),
            503: described(BoxAdmission, "Held: warming, within the gate's bounds"),
        },
    )
    async def box_admit(box_id: str) -> JSONResponse:
        try:
            found = await queries().admit(box_id)
        except StatusUnavailable as exc:  # nothing here can judge the box: fail open, as a probe must
            return JSONResponse(_held(box_id, str(exc)) | {"admit": True, "release": "unjudged"}, 200)
        if found is None:
            return JSONResponse(_held(box_id, "unknown box"), 404)
        body = {"box": box_id, "admit": found.admit, "ready": found.ready, "reason": found.reason,
                "release": found.release, "reasons": list(found.reasons)}  # fmt: skip
        return JSONResponse(body, 200 if found.admit else 503)

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


def _held(box_id: str, reason: str) -> dict[str, object]:
    return {
        "box": box_id,
        "admit": False,
        "ready": False,
        "reason": reason,
        "release": None,
        "reasons": [reason],
    }
