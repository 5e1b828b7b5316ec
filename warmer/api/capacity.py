"""`GET /v1/capacity`: per agent group, the uncached prefill budget left (tokens/s), for pacing a campaign.

Behind the bearer token like `/v1/routes`. Thin shell: the answer is `warmer.service.views.capacity`.
"""

from __future__ import annotations

import dataclasses

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from warmer.api.auth import require_token
from warmer.api.schemas import UNAUTHORIZED, UNAVAILABLE, CapacityTable, described, unavailable
from warmer.api.services import ApiServices


def router(services: ApiServices) -> APIRouter:
    routes = APIRouter(tags=["capacity"])
    protected = [Depends(require_token(services))]

    @routes.get(
        "/v1/capacity",
        summary="Per agent: routed boxes, prefill ceiling, budget (ceiling x safe fraction), uncached "
        "tokens/s used, headroom tokens/s and the turn-1 calls/minute it carries; per box the same; the "
        "agents no box keeps warm (shortfall)",
        dependencies=protected,
        responses={
            200: described(CapacityTable, "Prefill budget per agent group and per box"),
            **UNAUTHORIZED,
            **UNAVAILABLE,
        },
    )
    async def capacity() -> JSONResponse:
        if services.capacity is None:
            return unavailable("capacity is not available")
        report = await services.capacity.report()
        return JSONResponse(
            {
                "safe_fraction": report.safe_fraction,
                "unit": "uncached prompt tokens per second",
                "agents": {a.agent_id: dataclasses.asdict(a) for a in report.agents},
                "boxes": {b.box_id: dataclasses.asdict(b) for b in report.boxes},
                "shortfall": None if report.shortfall is None else dataclasses.asdict(report.shortfall),
            }
        )

    return routes
