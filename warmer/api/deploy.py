"""`POST /v1/events/deploy`: the signed deploy webhook. Thin shell over `warmer.service.fleet.deploy`.

No bearer token: the HMAC signature over the raw body is the authentication (the deploy pipeline holds the
shared secret). The body is read raw and bounded, because the signature covers the exact bytes sent.

Status codes: 202 accepted; 200 `{"duplicate": true}` for an event id already received (a retry or a replay
within the tolerance: acknowledged, nothing changes); 400 not a JSON object warmer reads (also JSON nested
deeper than 64 levels, a number over 40 characters, NaN/Infinity); 401 signature missing, forged or stale (a
replay after the tolerance); 413 body over `api.webhook_max_body_bytes`; 422 invalid fields or boxes/agents
the daemon does not have (`problems` lists field paths); 503 webhook disabled (no secret) or the database
unavailable.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import TypeAdapter

from warmer.api.bodies import BodyTooLarge, read_limited
from warmer.api.schemas import DeployAnswer, described, inline_json_schema
from warmer.api.services import ApiServices
from warmer.config.webhook_payloads import DeployEvent
from warmer.core.webhook import SIGNATURE_HEADER
from warmer.service.fleet.deploy import DeployOutcome, DeployResult

_STATUS = {
    DeployOutcome.ACCEPTED: 202,
    DeployOutcome.DUPLICATE: 200,
    DeployOutcome.DISABLED: 503,
    DeployOutcome.UNSIGNED: 401,
    DeployOutcome.FORGED: 401,
    DeployOutcome.STALE: 401,
    DeployOutcome.MALFORMED: 400,
    DeployOutcome.INVALID: 422,
    DeployOutcome.UNAVAILABLE: 503,
}


def _answer(result: DeployResult) -> JSONResponse:
    code = _STATUS[result.outcome]
    body: dict[str, Any] = {"outcome": result.outcome.value, "event_id": result.event_id, "kind": result.kind}
    if result.outcome is DeployOutcome.ACCEPTED:
        body["accepted"] = True
    elif result.outcome is DeployOutcome.DUPLICATE:
        body |= {"accepted": False, "duplicate": True, "detail": result.detail}
    else:
        body["detail"] = result.detail
        if result.problems:
            body["problems"] = [{"field": path, "message": message} for path, message in result.problems]
    headers = {"WWW-Authenticate": 'Signature header="X-Warmer-Signature"'} if code == 401 else None
    return JSONResponse(body, code, headers=headers)


def router(services: ApiServices) -> APIRouter:
    routes = APIRouter(tags=["events"])

    @routes.post(
        "/v1/events/deploy",
        summary="Signed deploy webhook: prompt changes, rollouts, boxes added or removed (idempotent by id)",
        status_code=202,
        openapi_extra={
            "parameters": [
                {
                    "name": SIGNATURE_HEADER,
                    "in": "header",
                    "required": True,
                    "schema": {"type": "string"},
                    "description": "t=<unix seconds>,v1=<hex HMAC-SHA256 of '<t>.' + raw body>",
                }
            ],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            **inline_json_schema(TypeAdapter(DeployEvent).json_schema()),
                            "description": "One deploy event; `kind` selects its fields",
                        }
                    }
                },
            },
        },
        responses={
            200: described(DeployAnswer, "Duplicate event id: acknowledged, nothing changed"),
            202: described(DeployAnswer, "Accepted"),
            400: described(DeployAnswer, "Body is not a JSON object warmer reads (syntax, nesting, numbers)"),
            401: described(DeployAnswer, "Signature missing, forged, or timestamp outside the tolerance"),
            413: described(DeployAnswer, "Body over api.webhook_max_body_bytes"),
            422: described(DeployAnswer, "Invalid fields, or boxes/agents the daemon does not have"),
            503: described(DeployAnswer, "Webhook disabled (no secret), database down"),
        },
    )
    async def deploy_event(request: Request) -> JSONResponse:
        handler = services.deploy
        if handler is None:
            return JSONResponse(
                {"outcome": "disabled", "detail": "the deploy webhook is not available in this process"}, 503
            )
        try:
            body = await read_limited(request, services.webhook_max_body_bytes, "api.webhook_max_body_bytes")
        except BodyTooLarge as exc:
            return JSONResponse({"outcome": "too_large", "detail": str(exc)}, 413)
        result = await handler.handle(body, request.headers.get(SIGNATURE_HEADER))
        return _answer(result)

    return routes
