"""Bearer-token check for the dialer and ops routes, as a FastAPI dependency."""

from __future__ import annotations

import hmac
from collections.abc import Callable

from fastapi import HTTPException, Request, status

from warmer.api.services import ApiServices


def require_token(services: ApiServices) -> Callable[[Request], None]:
    """A dependency that accepts a request carrying any configured token (constant-time compare).

    With no tokens configured every request passes: settings validation only allows that on a loopback bind.
    """
    expected = [token.get_secret_value().encode() for token in services.tokens]

    def check(request: Request) -> None:
        if not expected:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        presented = given.strip().encode()
        # Compare against every token, without stopping early, so timing says nothing about which matched.
        matched = False
        for token in expected:
            matched |= hmac.compare_digest(presented, token)
        if scheme.lower() != "bearer" or not presented or not matched:
            raise HTTPException(
                status_code=status.HTTP_401_UNAUTHORIZED,
                detail="missing or invalid bearer token",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return check
