"""The API's server stack, chosen for a dialer's rate of pre-call asks: uvicorn over uvloop and httptools.

A `warmer serve` process is one event loop (the reconciler's state lives in it, so no worker processes),
and every pre-call ask is a short request on a kept-alive connection. What costs CPU per ask outside
warmer's own code is the loop's socket handling and the HTTP parsing, so both are the C implementations
by default: uvloop (libuv) and httptools (llhttp); `api.event_loop = "asyncio"` and
`api.http_parser = "h11"` select the pure-Python ones. Access logs stay off unless asked for
(`api.access_log`); the accept backlog is `api.backlog`. BENCHMARKS.md ("Pre-call answers at dialer
scale") has each choice measured.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Generator
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from warmer.config.server_settings import ApiSettings


class ApiServer(uvicorn.Server):
    """uvicorn without its own signal handlers: the supervisor owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def api_server(app: ASGIApp, api: ApiSettings, *, graceful_shutdown_seconds: int) -> ApiServer:
    """The API server for `app`, served from the running event loop (`await server.serve()`)."""
    config = uvicorn.Config(
        app,
        host=api.host,
        port=api.port,
        http=api.http_parser,
        loop="none",  # the daemon's loop is already running: `run_daemon_loop` chose it
        backlog=api.backlog,
        access_log=api.access_log,
        log_config=None,  # our logging setup renders uvicorn's records
        lifespan="off",  # the daemon, not the web app, owns resources
        server_header=False,
        timeout_graceful_shutdown=graceful_shutdown_seconds,
    )
    return ApiServer(config)


def run_daemon_loop(main: Coroutine[Any, Any, int], event_loop: str) -> int:
    """Run `main` to completion on a new event loop of the configured kind; its result is returned."""
    if event_loop == "uvloop":
        import uvloop  # a dependency on every platform warmer serves from (see pyproject)

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    return asyncio.run(main)
