"""Dialer schedule: `PUT /v1/campaigns/{id}`, `DELETE /v1/campaigns/{id}`, `GET /v1/campaigns` (bearer token).

Thin shell over `CampaignService`: the body is checked for shape here (pydantic), the meaning (time
formats, window order, known agent, id charset) in `warmer.core.campaigns`, so the schedule file gets the
same checks. A bad field is 422 naming it; nothing is stored.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    WithJsonSchema,
)

from warmer.api.auth import require_token
from warmer.api.bodies import read_json
from warmer.api.prewarm import first_problem, invalid
from warmer.api.schemas import (
    UNAUTHORIZED,
    UNAVAILABLE,
    CampaignList,
    Problem,
    StoredCampaign,
    TooLarge,
    described,
    unavailable,
)
from warmer.api.services import ApiServices
from warmer.core.campaigns import (
    MAX_EXPECTED_CALLS,
    MAX_INSTANT_SECONDS,
    CampaignDraft,
    CampaignInvalid,
    UnknownCampaignAgent,
    campaign_json,
)
from warmer.service.dialer.campaigns import CampaignService

# Checked in warmer.core.campaigns (one validator for the API and the schedule file); the schema only says
# what it accepts, range included, so clients and generated tests see the real bounds.
Instant = Annotated[
    StrictStr | StrictInt | StrictFloat,
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "format": "date-time", "description": "ISO-8601 with an offset"},
                {
                    "type": "number",
                    "minimum": 0,
                    "maximum": MAX_INSTANT_SECONDS,
                    "description": "unix seconds",
                },
            ]
        }
    ),
]


class CampaignBody(BaseModel):
    """A campaign: its agent's prefixes are warm from the lead time before `starts_at` until `ends_at`."""

    model_config = ConfigDict(extra="forbid")

    agent: StrictStr = Field(min_length=1, max_length=200, description="Agent id the campaign dials for.")
    starts_at: Instant = Field(description="Window start: ISO-8601 with an offset, or unix seconds.")
    ends_at: Instant = Field(
        description="Window end (after starts_at): ISO-8601 with an offset, or unix seconds."
    )
    expected_calls: StrictInt = Field(
        default=0, ge=0, le=MAX_EXPECTED_CALLS, description="Calls expected in the window (sizes the group)."
    )


def router(services: ApiServices) -> APIRouter:
    routes = APIRouter(tags=["dialer"])
    protected = [Depends(require_token(services))]

    def service() -> CampaignService | None:
        return services.campaigns

    @routes.put(
        "/v1/campaigns/{campaign_id}",
        summary="Create (201) or replace (200) a campaign by id",
        dependencies=protected,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": CampaignBody.model_json_schema()}},
            }
        },
        responses={
            200: described(StoredCampaign, "Replaced: the stored campaign"),
            201: described(StoredCampaign, "Created: the stored campaign"),
            400: described(
                Problem, "Body is not JSON warmer reads (syntax, nesting, numbers): {field, detail}"
            ),
            404: described(Problem, "Unknown agent"),
            413: described(TooLarge, "Body over api.max_request_bytes"),
            422: described(Problem, "Bad field: {field, detail}"),
            **UNAUTHORIZED,
            **UNAVAILABLE,
        },
    )
    async def put_campaign(campaign_id: str, request: Request) -> JSONResponse:
        campaigns = service()
        if campaigns is None:
            return unavailable("campaigns are not configured")
        data, error = await read_json(request, services.max_request_bytes)
        if error is not None:
            return error
        try:
            body = CampaignBody.model_validate(data)
        except ValidationError as exc:
            return invalid(*first_problem(exc))
        draft = CampaignDraft(campaign_id, body.agent, body.starts_at, body.ends_at, body.expected_calls)
        try:
            stored, created = await campaigns.put(draft)
        except UnknownCampaignAgent as exc:
            return JSONResponse({"error": "unknown_agent", "field": "agent", "detail": exc.message}, 404)
        except CampaignInvalid as exc:
            return invalid(exc.field, exc.message)
        return JSONResponse(campaign_json(stored), 201 if created else 200)

    @routes.delete(
        "/v1/campaigns/{campaign_id}",
        summary="Delete a campaign (its agent is released after its other reasons end)",
        dependencies=protected,
        status_code=204,
        responses={
            204: {"description": "Deleted"},
            404: described(Problem, "No such campaign"),
            **UNAUTHORIZED,
            **UNAVAILABLE,
        },
    )
    async def delete_campaign(campaign_id: str) -> Response:
        campaigns = service()
        if campaigns is None:
            return unavailable("campaigns are not configured")
        deleted = await campaigns.delete(campaign_id)
        if not deleted:
            return JSONResponse({"error": "not_found", "detail": f"no campaign {campaign_id!r}"}, 404)
        return Response(status_code=204)

    @routes.get(
        "/v1/campaigns",
        summary="Every stored campaign, by start time",
        dependencies=protected,
        responses={200: described(CampaignList, "Every stored campaign"), **UNAUTHORIZED, **UNAVAILABLE},
    )
    async def list_campaigns() -> JSONResponse:
        campaigns = service()
        if campaigns is None:
            return unavailable("campaigns are not configured")
        found = await campaigns.list()
        return JSONResponse({"campaigns": [campaign_json(c) for c in found]})

    return routes
