"""`POST /v1/boxes/{box_id}/side-slot`: where a dialer's side request (no agent's call: a transcript summary,
a classifier) should go on a box, asked right before it is sent (bearer token). Thin shell over
`PrewarmService.side_slot`; the rule is `warmer.service.reconciler.side_requests`.

A POST, not a GET: the answer lends the slot (warmer stops vouching for the prefix it overwrites until it
is verified again), so asking changes state. The body is ignored.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from warmer.api.auth import require_token
from warmer.api.prewarm import invalid
from warmer.api.schemas import UNAUTHORIZED, UNAVAILABLE, Problem, described, unavailable
from warmer.api.services import ApiServices
from warmer.service.dialer.prewarm import UnknownSideRequestBox

MAX_WAIT_MS = 600_000  # a bound on the number itself; the service caps the wait as it caps a pre-call ask's


class SideSlotBody(BaseModel):
    box_id: str
    base_url: str
    slot: int | None = Field(
        description="Send the side request with this llama.cpp `id_slot`; null: send it without a slot (an "
        "engine without slots, or every slot has work in flight or a prefix just answered ready)."
    )
    evicts: str | None = Field(
        description="The agent whose prefix the side request overwrites there: warmer answers it ready again "
        "only once verified (a probe follows the side request into its slot)."
    )
    detail: str


def router(services: ApiServices) -> APIRouter:
    routes = APIRouter(tags=["dialer"])
    protected = [Depends(require_token(services))]

    @routes.post(
        "/v1/boxes/{box_id}/side-slot",
        summary="Side request: the slot a request that is no agent's call should name on the box (lent: the "
        "prefix it overwrites is not answered ready until verified again)",
        dependencies=protected,
        openapi_extra={
            "parameters": [
                {
                    "name": "wait_ms",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_MS, "default": 0},
                    "description": "While every slot has work in flight or a prefix just answered ready, "
                    "wait up to this long for one (capped by dialer.prewarm_max_wait_seconds); 0: at once.",
                }
            ]
        },
        responses={
            200: described(SideSlotBody, "The slot to name (or none) and the prefix it overwrites"),
            404: described(Problem, "Unknown box: {field, detail}"),
            422: described(Problem, "Bad wait_ms"),
            **UNAUTHORIZED,
            **UNAVAILABLE,
        },
    )
    async def side_slot(box_id: str, request: Request) -> JSONResponse:
        prewarm = services.prewarm
        if prewarm is None:
            return unavailable("pre-call answers are not configured")
        raw = request.query_params.get("wait_ms", "0")
        if not raw.isdigit() or int(raw) > MAX_WAIT_MS:
            return invalid("wait_ms", f"must be a whole number of milliseconds from 0 to {MAX_WAIT_MS}")
        try:
            answer = await prewarm.side_slot(box_id, int(raw) / 1000.0)
        except UnknownSideRequestBox as exc:
            return JSONResponse({"error": "not_found", "field": "box_id", "detail": str(exc)}, 404)
        return JSONResponse(answer.as_json())

    return routes
