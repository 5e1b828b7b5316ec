"""Bearer-token check for the dialer and ops routes: a FastAPI dependency, and the same check for the
pre-call front door, which answers before FastAPI's routing (`warmer.api.prewarm`)."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import HTTPException, Request, Security, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from warmer.api.services import ApiServices

UNAUTHORIZED_DETAIL = "missing or invalid bearer token"
# The scheme the OpenAPI document declares for every protected operation (components.securitySchemes), so
# generated clients and /docs send the token. It documents only: the check below does the comparing.
BEARER = HTTPBearer(
    scheme_name="bearer",
    description="A token from api.tokens: `Authorization: Bearer <token>`.",
    auto_error=False,
)
_DECLARED = Security(BEARER)
# The same declaration for an operation that checks the token itself (the pre-call front door).
SECURED: dict[str, Any] = {"security": [{"bearer": []}]}


def expected_tokens(services: ApiServices) -> tuple[bytes, ...]:
    return tuple(token.get_secret_value().encode() for token in services.tokens)


def bearer_accepted(expected: Sequence[bytes], authorization: str) -> bool:
    """Whether an `Authorization` header value carries any of `expected` (constant-time compare).

    With no tokens configured every request passes: settings validation only allows that on a loopback bind.
    """
    if not expected:
        return True
    scheme, _, given = authorization.partition(" ")
    presented = given.strip().encode()
    # Compare against every token, without stopping early, so timing says nothing about which matched.
    matched = False
    for token in expected:
        matched |= hmac.compare_digest(presented, token)
    return scheme.lower() == "bearer" and bool(presented) and matched


def require_token(services: ApiServices) -> Callable[[Request], Awaitable[None]]:
    """A dependency that accepts a request carrying any configured token.

    Async on purpose: FastAPI runs a plain function dependency in its thread pool, a thread hop per request
    for a check that takes microseconds."""
    expected = expected_tokens(services)

    async def check(request: Request, _declared: HTTPAuthorizationCredentials | None = _DECLARED) -> None:
        if not bearer_accepted(expected, request.headers.get("authorization", "")):
            raise HTTPException(
                status_code=status.HTTP_401_UNAUTHORIZED,
                detail=UNAUTHORIZED_DETAIL,
                headers={"WWW-Authenticate": "Bearer"},
            )

    return check
