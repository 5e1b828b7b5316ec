"""Bearer-token check for the dialer and ops routes: a FastAPI dependency, and the same check for the
pre-call front door, which answers before FastAPI's routing (`warmer.api.prewarm`)."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence

from fastapi import HTTPException, Request, status

from warmer.api.services import ApiServices

UNAUTHORIZED_DETAIL = "missing or invalid bearer token"


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

    async def check(request: Request) -> None:
        if not bearer_accepted(expected, request.headers.get("authorization", "")):
            raise HTTPException(
                status_code=status.HTTP_401_UNAUTHORIZED,
                detail=UNAUTHORIZED_DETAIL,
                headers={"WWW-Authenticate": "Bearer"},
            )

    return check
