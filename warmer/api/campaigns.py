"""Dialer schedule: `PUT /v1/campaigns/{id}`, `DELETE /v1/campaigns/{id}`, `GET /v1/campaigns` (bearer token).

Thin shell over `CampaignService`: the body is checked for shape here (pydantic), the meaning (time
formats, window order, known agent, id charset) in `warmer.core.campaigns`, so the schedule file gets the
same checks. A bad field is 422 naming it; nothing is stored.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError

from warmer.api.auth import require_token
from warmer.api.bodies import read_json
from warmer.api.prewarm import first_problem, invalid
from warmer.api.services import ApiServices
from warmer.core.campaigns import CampaignDraft, CampaignInvalid, UnknownCampaignAgent, campaign_json
from warmer.service.campaigns import CampaignService, CampaignsUnavailable

Instant = StrictStr | StrictInt | StrictFloat


class CampaignBody(BaseModel):
    """A campaign: its agent's prefixes are warm from the lead time before `starts_at` until `ends_at`."""

    model_config = ConfigDict(extra="forbid")

    agent: StrictStr = Field(min_length=1, max_length=200, description="Agent id the campaign dials for.")
    starts_at: Instant = Field(description="Window start: ISO-8601 with an offset, or unix seconds.")
    ends_at: Instant = Field(
        description="Window end (after starts_at): ISO-8601 with an offset, or unix seconds."
    )
    expected_calls: StrictInt = Field(
        default=0, ge=0, description="Calls expected in the window (sizes the group)."
    )


def _unavailable(reason: str) -> JSONResponse:
    return JSONResponse({"error": "unavailable", "reason": reason}, 503)


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
            200: {"description": "Replaced: the stored campaign"},
            201: {"description": "Created: the stored campaign"},
            400: {"description": "Body is not JSON warmer reads (syntax, nesting, numbers): {field, detail}"},
            404: {"description": "Unknown agent"},
            413: {"description": "Body over api.max_request_bytes"},
            422: {"description": "Bad field: {field, detail}"},
        },
    )
    async def put_campaign(campaign_id: str, request: Request) -> JSONResponse:
        campaigns = service()
        if campaigns is None:
            return _unavailable("campaigns are not configured")
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
        except CampaignsUnavailable as exc:
            return _unavailable(str(exc))
        return JSONResponse(campaign_json(stored), 201 if created else 200)

    @routes.delete(
        "/v1/campaigns/{campaign_id}",
        summary="Delete a campaign (its agent is released after its other reasons end)",
        dependencies=protected,
        status_code=204,
        responses={204: {"description": "Deleted"}, 404: {"description": "No such campaign"}},
    )
    async def delete_campaign(campaign_id: str) -> Response:
        campaigns = service()
        if campaigns is None:
            return _unavailable("campaigns are not configured")
        try:
            deleted = await campaigns.delete(campaign_id)
        except CampaignsUnavailable as exc:
            return _unavailable(str(exc))
        if not deleted:
            return JSONResponse({"error": "not_found", "detail": f"no campaign {campaign_id!r}"}, 404)
        return Response(status_code=204)

    @routes.get("/v1/campaigns", summary="Every stored campaign, by start time", dependencies=protected)
    async def list_campaigns() -> JSONResponse:
        campaigns = service()
        if campaigns is None:
            return _unavailable("campaigns are not configured")
        try:
            found = await campaigns.list()
        except CampaignsUnavailable as exc:
            return _unavailable(str(exc))
        return JSONResponse({"campaigns": [campaign_json(c) for c in found]})

    return routes
