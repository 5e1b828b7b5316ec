"""Reading request bodies at the front doors: bounded in size while they stream in, and parsed as JSON only
through `warmer.core.jsonbody` (bounded depth and numbers), so hostile input is a 413 or a 400 with a
reason, never a 500 or a dropped connection."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from warmer.core.jsonbody import JsonBodyRejected, parse_json_body


class BodyTooLarge(Exception):
    """The body is over the configured limit (HTTP 413); nothing past the limit was read."""

    def __init__(self, limit: int, setting: str) -> None:
        super().__init__(f"body over {limit} bytes (limit set by {setting})")
        self.limit = limit


async def read_limited(request: Request, limit: int, setting: str) -> bytes:
    """The raw body, refusing it as soon as the declared or the received size passes `limit`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit, setting)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit, setting)
        chunks.append(chunk)
    return b"".join(chunks)


def too_large(exc: BodyTooLarge) -> JSONResponse:
    return JSONResponse({"error": "too_large", "detail": str(exc)}, 413)


def malformed(reason: str) -> JSONResponse:
    return JSONResponse({"error": "malformed", "field": "body", "detail": reason}, 400)


async def read_json(request: Request, limit: int) -> tuple[Any, JSONResponse | None]:
    """(document, None), or (None, the 413/400 answer to send instead)."""
    try:
        raw = await read_limited(request, limit, "api.max_request_bytes")
    except BodyTooLarge as exc:
        return None, too_large(exc)
    try:
        return parse_json_body(raw), None
    except JsonBodyRejected as exc:
        return None, malformed(exc.reason)
