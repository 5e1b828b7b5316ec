"""Bounded HTTP calls to one box: URLs only from its registered `base_url`, transient-only retries.

`EngineHttp` builds every URL from the box's registered `base_url` plus a fixed path the adapter chose
(never a URL taken from a response), bounds each call by a timeout, retries only what a retry can fix, and
turns every failure into a typed error of `warmer.core.errors`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential, wait_random

from warmer.core.errors import EngineError, EngineSlow, EngineUnavailable, MalformedResponse
from warmer.core.model import BoxSpec, EngineTimeouts, RetryPolicy

JsonObject = dict[str, Any]

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
    ) -> tuple[int | None, bool]:
        """Health-style call: (HTTP status or None, whether it timed out). No retries.

        A timeout is told apart from "no answer at all" because some engines' health route does real work
        (SGLang runs a one-token generation) and is slow, not down, on a busy box.
        """
        try:
            response = await self._client.get(
                box_url(box, path), timeout=self._timeout(self.timeouts.health), headers=headers
            )
        except httpx.ConnectTimeout:
            return None, False
        except httpx.TimeoutException:
            return None, True
        except httpx.HTTPError:
            return None, False
        return response.status_code, False

    async def status(
        self, box: BoxSpec, path: str, *, headers: Mapping[str, str] | None = None
    ) -> int | None:
        """Health-style call: the HTTP status, or None when the engine did not answer at all. No retries.
        Raises `EngineSlow` when it took the connection but did not answer in time (busy, not down)."""
        status, timed_out = await self.health_answer(box, path, headers=headers)
        if timed_out:
            raise EngineSlow(box.id, f"GET {path} timed out after {self.timeouts.health:g}s")
        return status


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
