"""Bounded HTTP calls to one box: URLs only from its registered `base_url`, transient-only retries.

`EngineHttp` builds every URL from the box's registered `base_url` plus a fixed path the adapter chose
(never a URL taken from a response), bounds each call by a timeout, retries only what a retry can fix, and
turns every failure into a typed error of `warmer.core.errors`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential, wait_random

from warmer.core.errors import (
    EngineDown,
    EngineError,
    EngineSlow,
    EngineUnavailable,
    HealthFailure,
    MalformedResponse,
)
from warmer.core.model import BoxSpec, EngineTimeouts, RetryPolicy

JsonObject = dict[str, Any]

# The control read an engine request is part of (health, epoch, capacity, metrics), set by the dispatcher
# around the port call: every HTTP request it sends, retries and fallbacks included, counts as one of it.
CONTROL_KIND: ContextVar[str | None] = ContextVar("warmer_engine_control_kind", default=None)


@contextmanager
def control_request(kind: str) -> Iterator[None]:
    """Within this block, requests sent to engines count as control requests of `kind`."""
    token = CONTROL_KIND.set(kind)
    try:
        yield
    finally:
        CONTROL_KIND.reset(token)


def count_control_requests(client: httpx.AsyncClient, count: Callable[[str], None]) -> None:
    """Call `count(kind)` for every request `client` sends inside a `control_request` block: what the
    engines themselves answer, so a bench reads control traffic per box per minute off one counter."""

    async def on_request(request: httpx.Request) -> None:
        kind = CONTROL_KIND.get()
        if kind is not None:
            count(kind)

    hooks = dict(client.event_hooks)
    client.event_hooks = {**hooks, "request": [*hooks.get("request", []), on_request]}


class ControlPool(httpx.AsyncBaseTransport):
    """Control reads (requests inside a `control_request` block: health, epoch, capacity, metrics) on a
    connection pool of their own, the engine work (warm-ups, warms, probes) on another. On one pool, a
    region restart's warm-ups hold connections for whole prefills, and the health polls queue behind them
    until they time out in the pool: boxes counted slow or down because warmer itself was busy."""

    def __init__(self, control: httpx.AsyncBaseTransport, work: httpx.AsyncBaseTransport) -> None:
        self._control = control
        self._work = work

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        pool = self._control if CONTROL_KIND.get() is not None else self._work
        return await pool.handle_async_request(request)

    async def aclose(self) -> None:
        try:
            await self._control.aclose()
        finally:
            await self._work.aclose()


class PoolPerOrigin(httpx.AsyncBaseTransport):
    """A small connection pool per origin (scheme, host, port: one box), made by `make_pool` on its first
    request and kept. httpcore's pool scans every connection it holds on each request and each response
    it closes (an expiry check with a socket poll per idle connection, and a count of the idle ones per
    idle one): on one pool for the whole fleet that is O(boxes) to O(boxes²) per request, and a pool
    bounded below the fleet's size closes and reopens most boxes' connections every poll round. Per box,
    a request scans the few connections of its own box, and they stay open between polls."""

    def __init__(
        self,
        make_pool: Callable[[], httpx.AsyncBaseTransport],
        *,
        idle_seconds: float = 300.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._make_pool = make_pool
        self._pools: dict[tuple[bytes, bytes, int | None], httpx.AsyncBaseTransport] = {}
        # A box that left the fleet (discovery replaced its pod) is asked nothing more: its pool and the
        # connections it keeps are closed once unused for `idle_seconds` (a live box is polled every few).
        self._idle_seconds = idle_seconds
        self._monotonic = monotonic
        self._used: dict[tuple[bytes, bytes, int | None], float] = {}
        self._swept = monotonic()

    def pool_count(self) -> int:
        return len(self._pools)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        origin = (url.raw_scheme, url.raw_host, url.port)
        now = self._monotonic()
        if now - self._swept >= self._idle_seconds:
            await self._close_idle(now)
        pool = self._pools.get(origin)
        if pool is None:
            pool = self._pools[origin] = self._make_pool()
        self._used[origin] = now
        return await pool.handle_async_request(request)

    async def _close_idle(self, now: float) -> None:
        self._swept = now
        idle = [origin for origin, used in self._used.items() if now - used >= self._idle_seconds]
        for origin in idle:
            del self._used[origin]
            pool = self._pools.pop(origin)
            await pool.aclose()

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        self._used.clear()
        failed: BaseException | None = None
        for pool in pools:  # every pool is closed, even past one that fails to
            try:
                await pool.aclose()
            except Exception as exc:  # re-raised below, once the rest are closed
                failed = failed or exc
        if failed is not None:
            raise failed


_BODY_EXCERPT_CHARS = 200


def _excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _BODY_EXCERPT_CHARS else flat[:_BODY_EXCERPT_CHARS] + "..."


class EngineRejected(EngineError):
    """The engine answered 4xx: our request is wrong for it, so repeating it cannot help."""

    def __init__(self, box_id: str, message: str, *, status: int) -> None:
        super().__init__(box_id, message, transient=False)
        self.status = status


def box_url(box: BoxSpec, path: str) -> str:
    """The only way an adapter builds a URL: the box's registered base URL plus a fixed path."""
    if not path.startswith("/") or "://" in path:
        raise ValueError(f"engine path must be a plain absolute path, got {path!r}")
    return box.base_url.rstrip("/") + path


@dataclass(frozen=True, slots=True)
class HealthAnswer:
    """One health-style call: the status it answered (None: no answer), whether it timed out after
    taking the connection (busy, not down), and, unless it answered 200, how it failed."""

    status: int | None
    timed_out: bool = False
    failure: HealthFailure | None = None
    detail: str = ""

    def down(self, box: BoxSpec) -> EngineDown:
        """The failure as the error the reconciler records (kind and detail per box)."""
        return EngineDown(
            box.id, self.failure or HealthFailure.UNHEALTHY, self.detail or "health check failed"
        )


def _refused(exc: BaseException) -> bool:
    """Whether a connect error is ECONNREFUSED somewhere in its chain (httpx wraps httpcore wraps OSError)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@dataclass(frozen=True, slots=True)
class HttpResult:
    status: int
    text: str
    seconds: float


class EngineHttp:
    """Bounded, retried HTTP calls to one engine box over an injected `httpx.AsyncClient`.

    Retries cover transient failures only (connect errors, timeouts, 5xx including 503 while an engine
    is starting); a 4xx or an untrustworthy body is returned at once, because repeating it cannot help.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        timeouts: EngineTimeouts | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self._client = client
        self.timeouts = timeouts or EngineTimeouts()
        self.retry = retry or RetryPolicy()

    def _timeout(self, seconds: float) -> httpx.Timeout:
        return httpx.Timeout(seconds, connect=min(self.timeouts.connect, seconds))

    async def _once(
        self,
        box: BoxSpec,
        method: str,
        path: str,
        body: JsonObject | None,
        time_limit: float,
        headers: Mapping[str, str] | None = None,
    ) -> HttpResult:
        url = box_url(box, path)
        started = time.perf_counter()
        try:
            response = await self._client.request(
                method, url, json=body, timeout=self._timeout(time_limit), headers=headers
            )
        # httpx splits timeouts into connect / read / write / pool, all TimeoutException subclasses
        # (https://www.python-httpx.org/advanced/timeouts): only a connect timeout means no one took the call.
        except httpx.ConnectTimeout as exc:
            raise EngineUnavailable(box.id, f"{method} {path}: no connection within the time limit") from exc
        except httpx.TimeoutException as exc:
            raise EngineSlow(box.id, f"{method} {path} timed out after {time_limit:g}s") from exc
        except httpx.TransportError as exc:
            raise EngineUnavailable(box.id, f"{method} {path} failed: {type(exc).__name__}: {exc}") from exc
        seconds = time.perf_counter() - started
        text = response.text
        # 501 Not Implemented is permanent (e.g. llama-server /metrics without --metrics): no retry.
        if response.status_code >= 500 and response.status_code != 501:
            raise EngineUnavailable(
                box.id, f"{method} {path} answered HTTP {response.status_code}: {_excerpt(text)}"
            )
        if response.status_code >= 400:
            raise EngineRejected(
                box.id,
                f"{method} {path} answered HTTP {response.status_code}: {_excerpt(text)}",
                status=response.status_code,
            )
        return HttpResult(status=response.status_code, text=text, seconds=seconds)

    async def request(
        self,
        box: BoxSpec,
        method: str,
        path: str,
        *,
        body: JsonObject | None = None,
        time_limit: float | None = None,
        retry: bool = True,
        headers: Mapping[str, str] | None = None,
    ) -> HttpResult:
        """One call with the policy's retries for transient failures; raises typed errors. `headers` (e.g. a
        hosted API's key) are sent as they are and never appear in an error message."""
        limit = self.timeouts.request if time_limit is None else time_limit
        attempts = max(1, self.retry.attempts) if retry else 1
        retrying = AsyncRetrying(
            stop=stop_after_attempt(attempts),
            wait=wait_exponential(
                multiplier=self.retry.initial_backoff_seconds, max=self.retry.max_backoff_seconds
            )
            + wait_random(0, self.retry.jitter_seconds),
            retry=retry_if_exception(lambda exc: isinstance(exc, EngineError) and exc.transient),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._once(box, method, path, body, limit, headers)
        raise AssertionError("unreachable: tenacity re-raises the last failure")  # pragma: no cover

    async def get_json(
        self,
        box: BoxSpec,
        path: str,
        *,
        time_limit: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> JsonObject:
        result = await self.request(box, "GET", path, time_limit=time_limit, headers=headers)
        return parse_object(box, path, result.text)

    async def post_json(
        self,
        box: BoxSpec,
        path: str,
        body: JsonObject,
        *,
        time_limit: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[JsonObject, float]:
        """POST and parse a JSON object; also returns the call's wall seconds."""
        result = await self.request(box, "POST", path, body=body, time_limit=time_limit, headers=headers)
        return parse_object(box, path, result.text), result.seconds

    async def get_text(self, box: BoxSpec, path: str, *, time_limit: float | None = None) -> str:
        return (await self.request(box, "GET", path, time_limit=time_limit)).text

    async def health_answer(
        self, box: BoxSpec, path: str, *, headers: Mapping[str, str] | None = None
    ) -> HealthAnswer:
        """Health-style call, no retries: its status, or how it failed (refused, no answer to the
        connection, another transport error, a late answer, a non-200 status) with a detail. `headers`
        (a hosted API's key) are sent as they are and never appear in the detail.

        A timeout is told apart from "no answer at all" because some engines' health route does real work
        (SGLang runs a one-token generation) and is slow, not down, on a busy box.
        """
        limit = self.timeouts.health
        try:
            response = await self._client.get(
                box_url(box, path), timeout=self._timeout(limit), headers=headers
            )
        except httpx.ConnectTimeout:
            connect = min(self.timeouts.connect, limit)
            detail = f"GET {path}: no answer to the connection within {connect:g}s"
            return HealthAnswer(None, failure=HealthFailure.CONNECT_TIMEOUT, detail=detail)
        except httpx.TimeoutException:
            detail = f"GET {path} timed out after {limit:g}s"
            return HealthAnswer(None, timed_out=True, failure=HealthFailure.TIMEOUT, detail=detail)
        except httpx.ConnectError as exc:
            if _refused(exc):
                return HealthAnswer(
                    None, failure=HealthFailure.REFUSED, detail=f"GET {path}: connection refused"
                )
            detail = f"GET {path}: cannot connect: {exc}"
            return HealthAnswer(None, failure=HealthFailure.UNREACHABLE, detail=detail)
        except httpx.HTTPError as exc:
            detail = f"GET {path}: {type(exc).__name__}: {exc}"
            return HealthAnswer(None, failure=HealthFailure.UNREACHABLE, detail=detail)
        status = response.status_code
        if status == 200:
            return HealthAnswer(status)
        detail = f"GET {path} answered {status}: {_excerpt(response.text)}".rstrip(": ")
        return HealthAnswer(status, failure=HealthFailure.HTTP_STATUS, detail=detail)


def parse_object(box: BoxSpec, path: str, text: str) -> JsonObject:
    """The body as a JSON object, or MalformedResponse naming the endpoint."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise MalformedResponse(
            box.id, f"{path} returned a body that is not JSON: {_excerpt(text)!r}"
        ) from exc
    if not isinstance(value, dict):
        raise MalformedResponse(box.id, f"{path} returned JSON {type(value).__name__}, expected an object")
    return value
