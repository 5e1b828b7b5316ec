"""`POST /v1/usage` (a dialer reports one LLM turn's usage) and `GET /v1/usage` (turn 1 over the window),
behind the bearer token like the other dialer routes. Thin shell over `UsageService`.

The body is one call record exactly as a line of the log `warmer hitrate --calls` reads: `call_id`, `turn`,
optional `direction`, `agent` and `box`, and `usage` as the model's API answered it. Fields are read by
`warmer.core.call_usage` (the CLI's reader), so a bad field is a 422 naming it the way the CLI names it,
and `GET /v1/usage` answers what `warmer hitrate --calls FILE --json` prints for the same records.

Its own resource rather than a part of `/v1/capacity`: capacity is the prefill budget of routed boxes from
the engines' counters, read on every pass; this is what calls saw, as reported by the dialer, in a window
of its own. One path for the report in and the figures out keeps the two symmetrical.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from warmer.api.auth import require_token
from warmer.api.bodies import read_json
from warmer.api.prewarm import invalid
from warmer.api.schemas import UNAUTHORIZED, UNAVAILABLE, Problem, TooLarge, described, unavailable
from warmer.api.services import ApiServices
from warmer.core.call_report import CallUsageReport, call_usage_json
from warmer.core.call_usage import MAX_LABEL_CHARS, MAX_TURN, UsageFieldError, read_usage_record
from warmer.service.usage import UnknownUsageLabel


class UsageBody(BaseModel):
    """One LLM turn of a call (documents the body; `warmer.core.call_usage` reads it)."""

    model_config = ConfigDict(extra="allow")

    call_id: str = Field(min_length=1, max_length=MAX_LABEL_CHARS, description="The call's id.")
    turn: int = Field(ge=1, le=MAX_TURN, description="The call's LLM request index, 1 = its first.")
    direction: str | None = Field(
        default=None, max_length=MAX_LABEL_CHARS, description="Grouping value, e.g. inbound | outbound."
    )
    agent: str | None = Field(default=None, max_length=MAX_LABEL_CHARS, description="A configured agent.")
    box: str | None = Field(default=None, max_length=MAX_LABEL_CHARS, description="A fleet box it ran on.")
    usage: dict[str, Any] = Field(
        description="The usage object as the API answered: OpenAI Chat Completions / engines "
        "(prompt_tokens, prompt_tokens_details.cached_tokens), OpenAI Responses (input_tokens, "
        "input_tokens_details.cached_tokens), Anthropic Messages (input_tokens, cache_read_input_tokens, "
        "cache_creation_input_tokens)."
    )


class UsageRecorded(BaseModel):
    accepted: bool
    duplicate: bool = Field(description="The call's turn was already in the window: replaced, not added.")
    window_records: int


def router(services: ApiServices) -> APIRouter:
    routes = APIRouter(tags=["dialer"])
    protected = [Depends(require_token(services))]

    @routes.post(
        "/v1/usage",
        summary="Report one LLM turn's usage (per call and turn; a resend replaces it)",
        dependencies=protected,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": UsageBody.model_json_schema()}},
            }
        },
        responses={
            200: described(UsageRecorded, "Recorded in the window"),
            400: described(Problem, "Body is not JSON warmer reads (syntax, nesting, numbers)"),
            404: described(Problem, "Unknown agent or box: {field, detail}"),
            413: described(TooLarge, "Body over api.max_request_bytes"),
            422: described(Problem, "Bad field: {field, detail}"),
            **UNAUTHORIZED,
            **UNAVAILABLE,
        },
    )
    async def post_usage(request: Request) -> JSONResponse:
        usage = services.usage
        if usage is None:
            return unavailable("usage reports are not configured")
        data, error = await read_json(request, services.max_request_bytes)
        if error is not None:
            return error
        if not isinstance(data, dict):
            return invalid("body", "must be a JSON object")
        try:
            record = read_usage_record(data)
        except UsageFieldError as exc:
            return invalid(exc.field, exc.message)
        try:
            accepted = await usage.record(record)
        except UnknownUsageLabel as exc:
            return JSONResponse({"error": "not_found", "field": exc.field, "detail": exc.message}, 404)
        return JSONResponse({"accepted": True, **dataclasses.asdict(accepted)})

    @routes.get(
        "/v1/usage",
        summary="Turn 1 over the reported window: hit rate by turn, turns in the call, direction, box; the "
        "turn-1 cached-token spikes; depth vs coverage per agent (what `warmer hitrate --calls --json` "
        "prints)",
        dependencies=protected,
        responses={
            200: described(CallUsageReport, "The report over the window"),
            **UNAUTHORIZED,
            **UNAVAILABLE,
        },
    )
    async def get_usage() -> JSONResponse:
        usage = services.usage
        if usage is None:
            return unavailable("usage reports are not configured")
        return JSONResponse(call_usage_json(usage.report()))

    return routes
