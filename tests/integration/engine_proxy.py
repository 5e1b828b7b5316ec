"""A real HTTP server in front of a llama-server box that records every request and misbehaves on command.

warmer's config points at the proxy; the proxy forwards to the engine. What it records is what reached the
engine (the engine's own log is checked against it: `engine_completion_tasks`), so tests count warms per
(box, prefix) and restart warm-ups per box on the engine side, whatever warmer believes it sent.

Modes (`set_mode`), applied to the completion endpoints only unless `paths` says otherwise, so `/health`
and `/props` keep answering and the box looks up while its completions fail:
- PASS: forward;
- REFUSE: no listener at all on the port (connection refused), for every path;
- HANG: accept and never answer;
- ERROR: HTTP 500 with a plain-text body;
- GARBAGE: HTTP 200 whose body is not JSON;
- TRUNCATED: HTTP 200 promising more body than it sends, then the connection closes;
- HOLD: forward only once `release()` is called (a warm held in flight);
- LIE: forward with llama-server's `cache_prompt` off (nothing is reused), then claim the whole prompt
  but its last token cached, consistently (`timings.cache_n` / `prompt_n` and `usage`): a consistent liar.

Runs its own event loop in a thread (aiohttp server and client), so the test's own code stays synchronous.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import re
import threading
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from testbed.fleet import free_loopback_port

COMPLETION_PATHS = frozenset({"/completion", "/completions", "/v1/completions", "/v1/chat/completions"})
PROBE_MARK = "\n#probe "  # the executor's probe suffix starts with this (warmer/service/warming.py)
HANG_SECONDS = 3600.0


class Mode(enum.StrEnum):
    PASS = "pass"
    REFUSE = "refuse"
    HANG = "hang"
    ERROR = "error"
    GARBAGE = "garbage"
    TRUNCATED = "truncated"
    HOLD = "hold"
    LIE = "lie"


@dataclass(frozen=True, slots=True)
class Seen:
    """One request that reached the proxy, and what it did with it."""

    method: str
    path: str
    body: Any  # parsed JSON, or None
    mode: Mode
    status: int | None  # the engine's status when forwarded

    @property
    def forwarded(self) -> bool:
        return self.status is not None

    @property
    def prompt_ids(self) -> tuple[int, ...] | None:
        """The token ids leading a completion prompt given as a list (warmer sends prefixes as ids)."""
        prompt = self.body.get("prompt") if isinstance(self.body, dict) else None
        if not isinstance(prompt, list):
            return None
        return tuple(part for part in prompt if isinstance(part, int))

    @property
    def prompt_text(self) -> str | None:
        """The completion prompt as text: a string prompt, or the string parts of a mixed one."""
        if not isinstance(self.body, dict):
            return None
        prompt = self.body.get("prompt")
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, list):
            return "".join(part for part in prompt if isinstance(part, str))
        return None

    @property
    def is_restart_warmup(self) -> bool:
        """The restart warm-up's constrained-output request: exactly one per restart warm-up."""
        return isinstance(self.body, dict) and "json_schema" in self.body

    @property
    def is_probe(self) -> bool:
        text = self.prompt_text
        return text is not None and PROBE_MARK in text

    def is_prefix_warm(self, token_ids: Sequence[int]) -> bool:
        """A warm request of exactly the prefix (nothing after it; a keepalive touch looks the same)."""
        return self.path in COMPLETION_PATHS and self.prompt_ids == tuple(token_ids) and not self.prompt_text

    def is_prefix_probe(self, token_ids: Sequence[int]) -> bool:
        return self.path in COMPLETION_PATHS and self.prompt_ids == tuple(token_ids) and self.is_probe


Match = Callable[[Any], bool]


def prefix_requests(token_ids: Sequence[int]) -> Match:
    """Matches warmer's requests of one prefix (warms and probes: the ids, then nothing or a suffix)."""
    wanted = list(token_ids)

    def match(body: Any) -> bool:
        prompt = body.get("prompt") if isinstance(body, dict) else None
        return isinstance(prompt, list) and [p for p in prompt if isinstance(p, int)] == wanted

    return match


def burst_requests(body: Any) -> bool:
    """The restart warm-up's burst requests (warmer/service/restart.py `_bursts`)."""
    prompt = body.get("prompt") if isinstance(body, dict) else None
    return isinstance(prompt, str) and prompt.startswith("Warm-up burst ")


class EngineProxy:
    """`start()` -> the base URL to configure; `set_mode()` to misbehave; `seen()` what arrived."""

    def __init__(self, upstream: str, *, port: int | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = port or free_loopback_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._mode = Mode.PASS
        self._paths: frozenset[str] = COMPLETION_PATHS
        self._match: Match | None = None
        self._seen: list[Seen] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"proxy-{self.port}", daemon=True)
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._client: aiohttp.ClientSession | None = None
        self._released: asyncio.Event | None = None
        self._holding = 0
        self._closing: asyncio.Event | None = None

    # -- control (from the test's thread) ---------------------------------------------------------------

    def start(self) -> str:
        self._thread.start()
        self._call(self._start())
        return self.base_url

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def set_mode(
        self, mode: Mode, paths: Collection[str] = COMPLETION_PATHS, match: Match | None = None
    ) -> None:
        """Misbehave as `mode` on `paths` (and, with `match`, only on request bodies it accepts) from now on.
        REFUSE closes the port for every request."""
        self._call(self._set_mode(mode, frozenset(paths), match))

    def release(self) -> None:
        """Let the requests held by HOLD go on to the engine, and forward from now on."""
        self._call(self._set_mode(Mode.PASS, COMPLETION_PATHS, None))

    def seen(self) -> list[Seen]:
        with self._lock:
            return list(self._seen)

    def holding(self) -> int:
        """Requests waiting in HOLD now."""
        with self._lock:
            return self._holding

    def __enter__(self) -> EngineProxy:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -- the server (on the proxy's loop) ---------------------------------------------------------------

    def _call(self, coroutine: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout=60)

    async def _start(self) -> None:
        self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        self._released = asyncio.Event()
        self._closing = asyncio.Event()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        await self._listen()

    async def _listen(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await self._site.start()

    async def _stop(self) -> None:
        if self._closing is not None:
            self._closing.set()
        if self._released is not None:
            self._released.set()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._client is not None:
            await self._client.close()

    async def _set_mode(self, mode: Mode, paths: frozenset[str], match: Match | None) -> None:
        previous, self._mode, self._paths, self._match = self._mode, mode, paths, match
        assert self._released is not None
        if mode is Mode.HOLD:
            self._released = asyncio.Event()
        elif previous is Mode.HOLD:
            self._released.set()
        if mode is Mode.REFUSE and previous is not Mode.REFUSE and self._site is not None:
            await self._site.stop()
            self._site = None
        elif mode is not Mode.REFUSE and self._site is None:
            await self._listen()

    def _record(self, seen: Seen) -> None:
        with self._lock:
            self._seen.append(seen)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        applies = request.path in self._paths and (self._match is None or self._match(body))
        mode = self._mode if applies else Mode.PASS
        if mode is Mode.HANG:
            self._record(Seen(request.method, request.path, body, mode, None))
            assert self._closing is not None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), HANG_SECONDS)
            return web.Response(status=503, text="proxy: stopped while hanging")
        if mode is Mode.ERROR:
            self._record(Seen(request.method, request.path, body, mode, None))
            return web.Response(status=500, text="proxy: injected internal error")
        if mode is Mode.GARBAGE:
            self._record(Seen(request.method, request.path, body, mode, None))
            return web.Response(status=200, body=b"\x00\xffnot json {", content_type="application/json")
        if mode is Mode.TRUNCATED:
            self._record(Seen(request.method, request.path, body, mode, None))
            response = web.StreamResponse(status=200, headers={"Content-Length": "4096"})
            response.content_type = "application/json"
            await response.prepare(request)
            await response.write(b'{"content": " ", "timings": {"cache_n": ')
            assert request.transport is not None
            request.transport.close()
            return response
        if mode is Mode.HOLD:
            released = self._released
            assert released is not None
            with self._lock:
                self._holding += 1
            try:
                await released.wait()
            finally:
                with self._lock:
                    self._holding -= 1
        return await self._forward(request, raw, body, mode)

    async def _forward(self, request: web.Request, raw: bytes, body: Any, mode: Mode) -> web.Response:
        assert self._client is not None
        if mode is Mode.LIE and isinstance(body, dict):
            raw = json.dumps(body | {"cache_prompt": False}).encode()  # the engine reuses nothing
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept")}
        async with self._client.request(
            request.method, f"{self.upstream}{request.path_qs}", data=raw or None, headers=headers
        ) as upstream:
            content = await upstream.read()
            status = upstream.status
            content_type = upstream.headers.get("Content-Type", "application/json")
        self._record(Seen(request.method, request.path, body, mode, status))
        if mode is Mode.LIE and status == 200:
            content = _claim_all_cached(content)
        response = web.Response(status=status, body=content)
        response.headers["Content-Type"] = content_type
        return response


def _claim_all_cached(content: bytes) -> bytes:
    """llama-server's answer rewritten to claim every prompt token but the last from cache, with the
    counts consistent with each other (the prompt's total unchanged)."""
    try:
        answer = json.loads(content)
    except ValueError:
        return content
    timings = answer.get("timings") if isinstance(answer, dict) else None
    if isinstance(timings, dict) and "prompt_n" in timings:
        total = int(timings.get("cache_n", 0)) + int(timings["prompt_n"])
        timings["cache_n"], timings["prompt_n"] = total - 1, 1
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if isinstance(usage, dict) and "prompt_tokens" in usage:
        usage["prompt_tokens_details"] = {"cached_tokens": int(usage["prompt_tokens"]) - 1}
    return json.dumps(answer).encode()


_TASK_LINE = re.compile(r"launch_slot_: .*processing task")


def engine_completion_tasks(log_path: Path) -> int:
    """How many completion tasks llama-server's own log says it ran (`launch_slot_with_task` logs one
    `launch_slot_: ... processing task` line per completion request), over every process that wrote it."""
    return len(_TASK_LINE.findall(log_path.read_text(errors="replace")))
