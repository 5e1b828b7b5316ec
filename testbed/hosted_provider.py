"""A local stand-in for two hosted LLM APIs, implementing their documented prompt-cache rules, for tests.

No network here, and the real providers are never called: this server answers, on loopback, the two
request shapes warmer's hosted boxes send, and caches by the rules each provider documents:

- OpenAI Chat Completions (`POST /v1/chat/completions`; https://developers.openai.com/api/docs/guides/
  prompt-caching): automatic caching of prompts of `openai_min_tokens` (1,024) or more; a hit is the longest
  prefix shared with a live entry on the machine the request is routed to, rounded down to 128-token
  increments; routing by a hash of the first 256 tokens together with `prompt_cache_key`; an entry lives
  `openai_lifetime_seconds` after its last use; `usage.prompt_tokens_details.cached_tokens`.
- Anthropic Messages (`POST /v1/messages`; https://platform.claude.com/docs/en/build-with-claude/
  prompt-caching): a `cache_control: {"type": "ephemeral"}` block is a breakpoint over everything before it
  in the order tools, system, messages; a breakpoint below the model's minimum (`anthropic_min_tokens`)
  caches nothing; `ttl` "5m" (default) or "1h", refreshed on every read; `usage.input_tokens` (after the last
  breakpoint), `cache_creation_input_tokens`, `cache_read_input_tokens`.

Both need their API key (`Authorization: Bearer` / `x-api-key` with `anthropic-version`); `GET /v1/models`
lists the model. The provider's tokenizer here is the UTF-8 byte: one token per byte of the text it renders
(its own rendering, which warmer does not know, as with a real provider). Time is virtual: it starts at 0
and moves only by `POST /_testbed/advance {"seconds": s}`, so lifetimes are tested without sleeping. Each
answer says which machine served it (`x-testbed-machine`).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from testbed.fleet import free_loopback_port

ROUTING_PREFIX_TOKENS = 256  # "the hash typically uses the first 256 tokens" (OpenAI guide, Cache Routing)
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}


@dataclass(frozen=True, slots=True)
class ProviderRules:
    """The documented rules this server enforces (the defaults are the providers' documented figures)."""

    api_key: str = "test-key"
    model: str = "test-model"
    machines: int = 2
    openai_min_tokens: int = 1024
    openai_increment_tokens: int = 128
    openai_lifetime_seconds: float = 300.0
    anthropic_min_tokens: int = 1024


@dataclass(slots=True)
class _Entry:
    tokens: bytes
    last_used: float
    lifetime: float

    def alive(self, now: float) -> bool:
        return now - self.last_used <= self.lifetime


@dataclass(slots=True)
class _State:
    rules: ProviderRules
    now: float = 0.0
    machines: list[list[_Entry]] = field(default_factory=list)
    breakpoints: dict[bytes, _Entry] = field(default_factory=dict)  # Anthropic: exact prefixes
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _shared(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def render_openai(body: Mapping[str, Any]) -> bytes:
    """This provider's own prompt: tools first, then each message with a role header, then the answer cue."""
    parts = []
    if body.get("tools"):
        parts.append("<|tools|>" + _json(body["tools"]) + "\n")
    for message in body.get("messages", []):
        parts.append(f"<|{message.get('role')}|>{message.get('content')}\n")
    parts.append("<|assistant|>")
    return "".join(parts).encode()


def machine_for(rules: ProviderRules, tokens: bytes, key: str) -> int:
    """The machine a prompt is routed to: a hash of its first 256 tokens together with the cache key."""
    route = hashlib.sha256(tokens[:ROUTING_PREFIX_TOKENS] + b"\0" + key.encode()).digest()
    return int.from_bytes(route[:4], "big") % rules.machines


def _openai(state: _State, body: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    rules = state.rules
    tokens = render_openai(body)
    machine = machine_for(rules, tokens, str(body.get("prompt_cache_key", "")))
    entries = state.machines[machine]
    entries[:] = [e for e in entries if e.alive(state.now)]
    best, used = 0, None
    for entry in entries:
        shared = _shared(entry.tokens, tokens)
        if shared > best:
            best, used = shared, entry
    cached = 0 if best < rules.openai_min_tokens else best - best % rules.openai_increment_tokens
    if cached and used is not None:
        used.last_used = state.now
    if len(tokens) >= rules.openai_min_tokens and not any(e.tokens == tokens for e in entries):
        entries.append(_Entry(tokens, state.now, rules.openai_lifetime_seconds))
    usage = {
        "prompt_tokens": len(tokens),
        "completion_tokens": 1,
        "total_tokens": len(tokens) + 1,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    answer = {
        "id": f"chatcmpl-{len(state.requests)}",
        "object": "chat.completion",
        "model": body.get("model"),
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "length"}
        ],
        "usage": usage,
    }
    return answer, machine


def _anthropic_blocks(body: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any] | None]]:
    """(rendered text, cache_control) per block, in the documented order: tools, system, messages."""
    blocks: list[tuple[str, Mapping[str, Any] | None]] = []
    for tool in body.get("tools", []):
        plain = {k: v for k, v in tool.items() if k != "cache_control"}
        blocks.append(("<tool>" + _json(plain) + "\n", tool.get("cache_control")))
    system = body.get("system", [])
    if isinstance(system, str):
        system = [{"type": "text", "text": system}]
    for block in system:
        blocks.append(("<system>" + str(block.get("text", "")) + "\n", block.get("cache_control")))
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        for index, block in enumerate(content):
            head = f"<{message.get('role')}>" if index == 0 else ""
            blocks.append((head + str(block.get("text", "")) + "\n", block.get("cache_control")))
    return blocks


def _anthropic(state: _State, body: Mapping[str, Any]) -> dict[str, Any]:
    rules = state.rules
    rendered = b""
    ends: list[tuple[int, float]] = []  # token offset after each breakpoint block, and its lifetime
    for text, control in _anthropic_blocks(body):
        rendered += text.encode()
        if isinstance(control, Mapping) and control.get("type") == "ephemeral":
            ends.append((len(rendered), TTL_SECONDS[str(control.get("ttl", "5m"))]))
    total = len(rendered) + len(b"<assistant>")
    state.breakpoints = {k: e for k, e in state.breakpoints.items() if e.alive(state.now)}
    eligible = [(end, life) for end, life in ends if end >= rules.anthropic_min_tokens]
    read = 0
    for end, _ in reversed(eligible):  # the longest cached breakpoint prefix is read
        entry = state.breakpoints.get(rendered[:end])
        if entry is not None:
            entry.last_used = state.now
            read = end
            break
    written = 0
    for end, life in eligible:
        if end > read:
            state.breakpoints[rendered[:end]] = _Entry(rendered[:end], state.now, life)
            written = end - read
    last = max((end for end, _ in eligible), default=0)
    return {
        "id": f"msg_{len(state.requests)}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model"),
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "max_tokens",
        "usage": {
            "input_tokens": total - max(last, read),
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
            "output_tokens": 1,
        },
    }


def create_app(rules: ProviderRules) -> FastAPI:
    """The provider as an ASGI app (state lives in the app; one lock serializes the cache)."""
    app = FastAPI()
    state = _State(rules=rules, machines=[[] for _ in range(rules.machines)])
    app.state.provider = state

    def openai_authorized(request: Request) -> bool:
        return request.headers.get("authorization") == f"Bearer {rules.api_key}"

    def anthropic_authorized(request: Request) -> bool:
        key_ok = request.headers.get("x-api-key") == rules.api_key
        return key_ok and bool(request.headers.get("anthropic-version"))

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        if not (openai_authorized(request) or anthropic_authorized(request)):
            return JSONResponse({"error": {"message": "invalid API key"}}, status_code=401)
        return JSONResponse({"object": "list", "data": [{"id": rules.model, "object": "model"}]})

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        if not openai_authorized(request):
            error = {"message": "Incorrect API key provided", "type": "invalid_request_error"}
            return JSONResponse({"error": error}, status_code=401)
        body = await request.json()
        with state.lock:
            state.requests.append({"api": "openai", "body": body, "at": state.now})
            answer, machine = _openai(state, body)
        return JSONResponse(answer, headers={"x-testbed-machine": str(machine)})

    @app.post("/v1/messages")
    async def messages(request: Request) -> JSONResponse:
        if not anthropic_authorized(request):
            error = {"type": "authentication_error", "message": "invalid x-api-key"}
            return JSONResponse({"type": "error", "error": error}, status_code=401)
        body = await request.json()
        with state.lock:
            state.requests.append({"api": "anthropic", "body": body, "at": state.now})
            answer = _anthropic(state, body)
        return JSONResponse(answer)

    @app.post("/_testbed/advance")
    async def advance(request: Request) -> JSONResponse:
        seconds = float((await request.json())["seconds"])
        with state.lock:
            state.now += max(0.0, seconds)
            return JSONResponse({"now": state.now})

    return app


class HostedProvider:
    """The provider served by uvicorn on a loopback port, in a thread, for one test."""

    def __init__(self, rules: ProviderRules | None = None) -> None:
        self.rules = rules or ProviderRules()
        self.app = create_app(self.rules)
        self.port = free_loopback_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="hosted-provider", daemon=True)

    @property
    def requests(self) -> Sequence[dict[str, Any]]:
        """Every completion request received, in order (`api`, `body`, virtual time `at`)."""
        state: _State = self.app.state.provider
        with state.lock:
            return list(state.requests)

    def advance(self, seconds: float) -> None:
        state: _State = self.app.state.provider
        with state.lock:
            state.now += seconds

    def start(self, timeout: float = 10.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the hosted provider did not start on port {self.port}")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10.0)


@contextmanager
def hosted_provider(rules: ProviderRules | None = None) -> Iterator[HostedProvider]:
    provider = HostedProvider(rules)
    provider.start()
    try:
        yield provider
    finally:
        provider.stop()
