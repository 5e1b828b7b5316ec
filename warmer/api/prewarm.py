"""`POST /v1/prewarm`: the dialer's pre-call ask (bearer token). Thin shell over `PrewarmService`.

Errors are JSON with the field or reason: 400 {field: "body", detail} for a body that is not JSON warmer
reads (syntax, nesting deeper than 64, an over-long or infinite number), 413 for a body over
`api.max_request_bytes`, 422 {field, detail} for a bad field, 404 for an unknown agent,
503 {reason} (with Retry-After) when no box of the agent's group can take the call now.

A dialer asks before every call, thousands of times a second, so the ask is answered by `PrewarmFrontDoor`,
a pure ASGI layer ahead of FastAPI's entry point (`warmer.api.app.WarmerApi`): it reads the raw ASGI
messages and sends the answer itself. Through FastAPI's stack, route matching, dependency solving and
Request/Response objects an ask cost more than the pre-call service itself (BENCHMARKS.md, "Pre-call
answers at dialer scale"). The FastAPI route stays: it declares the operation in the served OpenAPI schema
and answers through the same `PrewarmHandler` in an app without the front door. What each ask still does
is what it must: the token check, a bounded body read, the hostile-input-safe JSON parse, strict pydantic
validation of its four fields, the service call. An answer's JSON is encoded once per distinct answer (a
warm agent's answers differ only by box) and reused.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from warmer.api.auth import SECURED, UNAUTHORIZED_DETAIL, bearer_accepted, expected_tokens
from warmer.api.observe import RequestObserver
from warmer.api.schemas import (
    UNAUTHORIZED,
    PrewarmAnswerBody,
    Problem,
    TooLarge,
    Unavailable,
    described,
)
from warmer.api.services import ApiServices
from warmer.api.storeerrors import STORE_RETRY_AFTER_SECONDS, store_problem
from warmer.core.errors import StoreError
from warmer.core.jsonbody import JsonBodyRejected, parse_json_body
from warmer.service.dialer.prewarm import (
    PrewarmAnswer,
    PrewarmAsk,
    PrewarmInvalid,
    PrewarmUnavailable,
    UnknownPrewarmAgent,
)

PATH = "/v1/prewarm"
RETRY_AFTER_SECONDS = "1"
# Distinct answers whose JSON is kept: a warm agent has one per box of its group (and slot); past this many
# the cache starts over rather than grow with the fleet's history.
ENCODED_ANSWERS_KEPT = 4096

Headers = list[tuple[bytes, bytes]]


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


def first_problem(error: ValidationError) -> tuple[str, str]:
    """(dotted field, message) of pydantic's first complaint, without echoing the value."""
    item = error.errors(include_url=False, include_input=False)[0]
    field = ".".join(str(part) for part in item["loc"]) or "body"
    return field, item["msg"]


def encode(document: object) -> bytes:
    """JSON as Starlette's JSONResponse writes it (compact, UTF-8, no NaN)."""
    return json.dumps(document, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Reply:
    """An HTTP answer as raw ASGI parts."""

    status: int
    body: bytes
    extra_headers: Headers

    def headers(self) -> Headers:
        return [
            (b"content-length", str(len(self.body)).encode()),
            (b"content-type", b"application/json"),
            *self.extra_headers,
        ]


def reply(status: int, document: object, extra_headers: Headers | None = None) -> Reply:
    return Reply(status, encode(document), extra_headers or [])


def invalid(field: str, detail: str) -> JSONResponse:
    """422 naming the field (the campaign routes answer bad fields the same way)."""
    return JSONResponse({"error": "invalid", "field": field, "detail": detail}, 422)


def invalid_reply(field: str, detail: str) -> Reply:
    return reply(422, {"error": "invalid", "field": field, "detail": detail})


UNAUTHORIZED_REPLY = reply(401, {"detail": UNAUTHORIZED_DETAIL}, [(b"www-authenticate", b"Bearer")])
NOT_CONFIGURED_REPLY = reply(503, {"error": "unavailable", "reason": "pre-call API not configured"})
CLIENT_GONE_REPLY = reply(400, {"error": "malformed", "field": "body", "detail": "client disconnected"})


class _TooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


class PrewarmHandler:
    """One ask, from the ASGI scope and receive channel to the answer's raw parts."""

    def __init__(self, services: ApiServices) -> None:
        self._services = services
        self._tokens = expected_tokens(services)
        self._limit = services.max_request_bytes
        self._encoded: dict[PrewarmAnswer, bytes] = {}

    async def answer(self, scope: Scope, receive: Receive) -> Reply:
        authorization, declared = "", None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"content-length":
                declared = value
        if not bearer_accepted(self._tokens, authorization):
            return UNAUTHORIZED_REPLY
        service = self._services.prewarm
        if service is None:
            return NOT_CONFIGURED_REPLY
        try:
            raw = await self._read_body(declared, receive)
        except _TooLarge:
            detail = f"body over {self._limit} bytes (limit set by api.max_request_bytes)"
            return reply(413, {"error": "too_large", "detail": detail})
        except _ClientGone:
            return CLIENT_GONE_REPLY
        try:
            data = parse_json_body(raw)
        except JsonBodyRejected as exc:
            return reply(400, {"error": "malformed", "field": "body", "detail": exc.reason})
        try:
            body = PrewarmBody.model_validate(data)
        except ValidationError as exc:
            return invalid_reply(*first_problem(exc))
        ask = PrewarmAsk(
            agent_id=body.agent,
            call_id=body.call_id,
            expected_calls=body.expected_calls,
            wait_seconds=body.wait_ms / 1000.0,
        )
        try:
            answer = await service.prewarm(ask)
        except PrewarmInvalid as exc:
            return invalid_reply(exc.field, exc.message)
        except UnknownPrewarmAgent as exc:
            return reply(404, {"error": "unknown_agent", "agent": exc.agent_id, "reason": str(exc)})
        except PrewarmUnavailable as exc:
            return reply(
                503,
                {"error": "unavailable", "agent": body.agent, "reason": str(exc)},
                [(b"retry-after", RETRY_AFTER_SECONDS.encode())],
            )
        except StoreError as exc:  # as the app's StoreError handler answers every other route
            return reply(
                503,
                {"error": "unavailable", "reason": store_problem(exc)},
                [(b"retry-after", STORE_RETRY_AFTER_SECONDS.encode())],
            )
        return Reply(200, self._encode(answer), [])

    def _encode(self, answer: PrewarmAnswer) -> bytes:
        encoded = self._encoded.get(answer)
        if encoded is None:
            if len(self._encoded) >= ENCODED_ANSWERS_KEPT:
                self._encoded.clear()
            encoded = self._encoded[answer] = encode(answer.as_json())
        return encoded

    async def _read_body(self, declared: bytes | None, receive: Receive) -> bytes:
        """The body, refused as soon as the declared or the received size passes the limit."""
        if declared is not None and declared.isdigit() and int(declared) > self._limit:
            raise _TooLarge
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > self._limit:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class PrewarmFrontDoor:
    """Pure ASGI: answers `POST /v1/prewarm` itself and passes every other request on to `app`.

    It reports each ask to the request metrics under its route template, as the metrics middleware
    reports the routes behind it."""

    def __init__(self, app: ASGIApp, handler: PrewarmHandler, observer: RequestObserver | None) -> None:
        self._app = app
        self._handler = handler
        self._observer = observer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        try:
            answer = await self._handler.answer(scope, receive)
            status = answer.status
            await send({"type": "http.response.start", "status": status, "headers": answer.headers()})
            await send({"type": "http.response.body", "body": answer.body})
        finally:
            if self._observer is not None:
                self._observer.request_finished(PATH, "POST", status, time.perf_counter() - started)


def router(services: ApiServices) -> APIRouter:
    routes = APIRouter(tags=["dialer"])
    handler = PrewarmHandler(services)

    @routes.post(
        PATH,
        summary="Pre-call: the box a call for the agent should use and the agent's prefix state there; "
        "warms at once when not warm (concurrent asks coalesce into one warm per box); optional bounded wait",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": PrewarmBody.model_json_schema()}},
            },
            **SECURED,  # checked by the front door itself, before routing
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
    async def prewarm(request: Request) -> Response:
        answer = await handler.answer(request.scope, request.receive)
        headers = {name.decode(): value.decode() for name, value in answer.extra_headers}
        return Response(answer.body, answer.status, headers, media_type="application/json")

    return routes
