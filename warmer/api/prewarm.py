"""`POST /v1/prewarm`: the dialer's pre-call ask (bearer token). Thin shell over `PrewarmService`.

Errors are JSON with the field or reason: 400 {field: "body", detail} for a body that is not JSON warmer
reads (syntax, nesting deeper than 64, an over-long or infinite number), 413 for a body over
`api.max_request_bytes`, 422 {field, detail} for a bad field, 404 for an unknown agent,
503 {reason} (with Retry-After) when no box of the agent's group can take the call now.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from warmer.api.auth import require_token
from warmer.api.bodies import read_json
from warmer.api.schemas import (
    UNAUTHORIZED,
    PrewarmAnswerBody,
    Problem,
    TooLarge,
    Unavailable,
    described,
)
from warmer.api.services import ApiServices
from warmer.service.prewarm import (
    PrewarmAsk,
    PrewarmInvalid,
    PrewarmUnavailable,
    UnknownPrewarmAgent,
)

RETRY_AFTER_SECONDS = "1"


class PrewarmBody(BaseModel):
    """The ask. `wait_ms` is capped by the daemon's `dialer.prewarm_max_wait_seconds`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    agent: str = Field(min_length=1, max_length=200, description="Agent id the call is for.")
    call_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="The call's id: retries of one call get the same box.",
    )
    expected_calls: int | None = Field(
        default=None, ge=0, le=1_000_000, description="Calls about to be placed (volume hint); default 1."
    )
    wait_ms: int = Field(
        default=0,
        ge=0,
        le=600_000,
        description="Wait up to this long for the prefix to be warm (0: answer now).",
    )


def invalid(field: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": "invalid", "field": field, "detail": detail}, 422)


def first_problem(error: ValidationError) -> tuple[str, str]:
    """(dotted field, message) of pydantic's first complaint, without echoing the value."""
    item = error.errors(include_url=False, include_input=False)[0]
    field = ".".join(str(part) for part in item["loc"]) or "body"
    return field, item["msg"]


def router(services: ApiServices) -> APIRouter:
    routes = APIRouter(tags=["dialer"])
    protected = [Depends(require_token(services))]

    @routes.post(
        "/v1/prewarm",
        summary="Pre-call: the box a call for the agent should use and the agent's prefix state there; "
        "warms at once when not warm (concurrent asks coalesce into one warm per box); optional bounded wait",
        dependencies=protected,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": PrewarmBody.model_json_schema()}},
            }
        },
        responses={
            200: described(PrewarmAnswerBody, "The box for the call and the agent's prefix state there"),
            400: described(
                Problem, "Body is not JSON warmer reads (syntax, nesting, numbers): {field, detail}"
            ),
            404: described(Problem, "Unknown agent"),
            413: described(TooLarge, "Body over api.max_request_bytes"),
            422: described(Problem, "Bad body: {field, detail}"),
            503: described(Unavailable, "No box can take the agent's call now, or the database is down"),
            **UNAUTHORIZED,
        },
    )
    async def prewarm(request: Request) -> JSONResponse:
        service = services.prewarm
        if service is None:
            return JSONResponse({"error": "unavailable", "reason": "pre-call API not configured"}, 503)
        data, error = await read_json(request, services.max_request_bytes)
        if error is not None:
            return error
        try:
            body = PrewarmBody.model_validate(data)
        except ValidationError as exc:
            return invalid(*first_problem(exc))
        ask = PrewarmAsk(
            agent_id=body.agent,
            call_id=body.call_id,
            expected_calls=body.expected_calls,
            wait_seconds=body.wait_ms / 1000.0,
        )
        try:
            answer = await service.prewarm(ask)
        except PrewarmInvalid as exc:
            return invalid(exc.field, exc.message)
        except UnknownPrewarmAgent as exc:
            return JSONResponse({"error": "unknown_agent", "agent": exc.agent_id, "reason": str(exc)}, 404)
        except PrewarmUnavailable as exc:
            return JSONResponse(
                {"error": "unavailable", "agent": body.agent, "reason": str(exc)},
                503,
                headers={"Retry-After": RETRY_AFTER_SECONDS},
            )
        return JSONResponse(answer.as_json())

    return routes
