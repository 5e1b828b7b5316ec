"""A database that does not answer, as the API says it: 503 with a one-line reason and Retry-After.

Registered on the app for `StoreError`, so every route that touches the store answers a database outage the
same way instead of a 500 with a traceback.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from warmer.core.errors import StoreError

# A client asked while the database did not answer may retry this soon (seconds).
STORE_RETRY_AFTER_SECONDS = "2"


def store_problem(exc: StoreError) -> str:
    """The database's complaint in one line: what failed, never the statement or its parameters (the
    SQL and its bound values follow on later lines of SQLAlchemy's message)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return first[:300]


async def store_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """The exception handler: a database outage is not the client's fault and a traceback helps no one."""
    assert isinstance(exc, StoreError)  # registered for StoreError only
    return JSONResponse(
        {"error": "unavailable", "reason": store_problem(exc)},
        503,
        headers={"Retry-After": STORE_RETRY_AFTER_SECONDS},
    )
