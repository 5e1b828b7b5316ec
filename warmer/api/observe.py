"""Request outcomes for /metrics: a pure ASGI middleware that reports every HTTP request by route template.

The route template (`/v1/boxes/{box_id}/ready`, not `/v1/boxes/b7/ready`) keeps the label set bounded
whatever callers send; a path that matched no route is reported as `unmatched`. Pure ASGI rather than
`BaseHTTPMiddleware` so streaming bodies and background tasks behave as without it. The template is read
after the app ran: Starlette's router writes the matched route into the (shared) scope.
"""

from __future__ import annotations

import time
from typing import Protocol

from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED_ROUTE = "unmatched"


class RequestObserver(Protocol):
    def request_finished(self, route: str, method: str, status: int, seconds: float) -> None: ...


class RequestMetricsMiddleware:
    """Reports (route template, method, status, seconds) of each HTTP request; 500 when the app raised."""

    def __init__(self, app: ASGIApp, observer: RequestObserver) -> None:
        self._app = app
        self._observer = observer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self._app(scope, receive, send_and_note)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None)
            self._observer.request_finished(
                template if isinstance(template, str) else UNMATCHED_ROUTE,
                str(scope.get("method", "")),
                status,
                time.perf_counter() - started,
            )
