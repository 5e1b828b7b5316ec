"""Hosted providers as boxes: an OpenAI-style API and Anthropic's Messages API, each one EnginePort.

A hosted box is a provider endpoint (its base URL, e.g. https://api.openai.com) and one model. warmer warms
an agent's stable request there (`warmer.core.hosted.stable_request`: the tools and the whole messages
before the first per-call value) with the provider's own cache hint at its end, then verifies by the usage
the provider returns. The provider counts tokens with its own tokenizer and rendering, so the layout says
`counts_own_tokens`: its count of the prefix sent alone is the bar a probe must clear (within one cache
increment and the final message's framing, `ProviderCache.hit_allowance`).

Every request carries the box's API key (from the environment variable the box names, read once at start);
the key goes only into the request header, never into a log line, an error or a report.

Request and response shapes:
- OpenAI Chat Completions (https://platform.openai.com/docs/api-reference/chat/create): `model`,
  `messages`, `tools`, `max_completion_tokens`, `prompt_cache_key`; `usage.prompt_tokens` and
  `usage.prompt_tokens_details.cached_tokens` (https://developers.openai.com/api/docs/guides/prompt-caching).
  Auth `Authorization: Bearer <key>`; `GET /v1/models` lists the models (the health check).
- Anthropic Messages (https://platform.claude.com/docs/en/api/messages): `model`, `max_tokens`, `system` as
  text blocks, `tools` (`name`, `description`, `input_schema`), `messages`; a block's
  `cache_control: {"type": "ephemeral", "ttl": "5m" | "1h"}` is a breakpoint; `usage.input_tokens`,
  `usage.cache_creation_input_tokens`, `usage.cache_read_input_tokens`
  (https://platform.claude.com/docs/en/build-with-claude/prompt-caching). Auth `x-api-key: <key>` and
  `anthropic-version: 2023-06-01`; `GET /v1/models` lists the models.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from warmer.adapters.engines.base import check_cached_within_prompt, count_field, dig, reject_error_body
from warmer.adapters.engines.http import EngineHttp, JsonObject
from warmer.adapters.engines.restart_watch import RestartWatch
from warmer.core.errors import EngineError, EngineSlow, MalformedResponse, NotSupported
from warmer.core.hosted import NotARequestPrefix, ProviderCache, StableRequest, stable_request
from warmer.core.model import (
    BoxCapacity,
    BoxSpec,
    CacheLayout,
    CacheStats,
    CompletionReport,
    EngineTimeouts,
    ModelProfile,
    Prefix,
    RetryPolicy,
)

ANTHROPIC_VERSION = "2023-06-01"
# The content of the final user message a warm carries (a probe carries its unique suffix instead).
WARM_MESSAGE = "."


class HostedEngine(ABC):
    """What the two hosted kinds share: keys, health by the model list, an epoch per warmer process, the
    profile's cache rules as the layout, and no tokenizer, template or counters of the provider's."""

    kind = "hosted"
    completion_path = ""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        profiles: Mapping[str, ModelProfile],
        api_keys: Mapping[str, str],
        timeouts: EngineTimeouts | None = None,
        retry: RetryPolicy | None = None,
        watch: RestartWatch | None = None,
    ) -> None:
        self._http = EngineHttp(client, timeouts=timeouts, retry=retry)
        self._profiles = dict(profiles)
        self._keys = dict(api_keys)  # box id -> API key; never logged
        self._watch = watch or RestartWatch()

    def __repr__(self) -> str:  # keys stay out of any repr a log or traceback might print
        return f"{type(self).__name__}(boxes={sorted(self._keys)})"

    # -- what each provider says its own way -----------------------------------------------------------

    @abstractmethod
    def _auth_headers(self, key: str) -> dict[str, str]: ...

    @abstractmethod
    def _body(
        self, box: BoxSpec, prefix: Prefix, stable: StableRequest, message: str, cache: ProviderCache
    ) -> JsonObject: ...

    @abstractmethod
    def _report(self, box: BoxSpec, body: JsonObject, wall: float) -> CompletionReport: ...

    # -- shared ----------------------------------------------------------------------------------------

    def _headers(self, box: BoxSpec) -> dict[str, str]:
        key = self._keys.get(box.id)
        if not key:
            raise EngineError(box.id, f"no API key for hosted box {box.id!r} (its api_key_env is unset)")
        return self._auth_headers(key)

    def _profile(self, box: BoxSpec) -> ModelProfile:
        profile = self._profiles.get(box.model)
        if profile is None or profile.provider is None:
            raise NotSupported(box.id, f"model profile {box.model!r} has no [provider] table")
        return profile

    def _model_name(self, box: BoxSpec) -> str:
        return self._profile(box).served_model_name or box.model

    async def health(self, box: BoxSpec) -> bool:
        """Up when the provider lists its models for this key; a rejected key is down (http_status, with
        the provider's answer), not slow; a late answer raises EngineSlow."""
        answer = await self._http.health_answer(box, "/v1/models", headers=self._headers(box))
        if answer.timed_out:
            raise EngineSlow(box.id, answer.detail)
        up = answer.status == 200
        self._watch.saw_health(box.id, up)
        if not up:
            raise answer.down(box)
        return True

    async def epoch(self, box: BoxSpec) -> str:
        """A provider has no process warmer can see: an epoch lasts while this warmer watches it (a restart
        of warmer re-verifies, as an honest reading of "unknown" must)."""
        return f"{self.kind}-{self._watch.epoch(box.id)}"

    async def cache_layout(self, box: BoxSpec) -> CacheLayout:
        cache = self._profile(box).provider
        assert cache is not None  # _profile checked it
        return CacheLayout(
            page_tokens=cache.hit_allowance(),
            source=f"{self.kind} profile: {cache.increment_tokens}-token increments + final message",
            counts_own_tokens=True,
        )

    async def capacity(self, box: BoxSpec) -> BoxCapacity:
        return BoxCapacity(source="a hosted provider does not report its cache size")

    async def cache_stats(self, box: BoxSpec) -> CacheStats:
        raise NotSupported(box.id, "a hosted provider exposes no prefix-cache counters")

    async def render_chat(
        self, box: BoxSpec, messages: Sequence[dict[str, object]], tools: Sequence[dict[str, object]]
    ) -> str:
        raise NotSupported(box.id, "a hosted provider does not render its prompt for us")

    async def tokenize(self, box: BoxSpec, text: str) -> list[int]:
        raise NotSupported(box.id, "a hosted provider has no tokenize endpoint")

    async def complete_prefix(
        self,
        box: BoxSpec,
        prefix: Prefix,
        *,
        suffix: str = "",
        max_tokens: int = 1,
        slot: int | None = None,
        rank: int | None = None,
    ) -> CompletionReport:
        if rank is not None:
            raise NotSupported(box.id, "a hosted provider has no data-parallel ranks to pin")
        try:
            stable = stable_request(prefix.text)
        except NotARequestPrefix as exc:
            raise NotSupported(
                box.id, f"the prefix is not a hosted request ({exc}): render it with the hosted form"
            ) from None
        cache = self._profile(box).provider
        assert cache is not None
        body = self._body(box, prefix, stable, suffix.strip() or WARM_MESSAGE, cache)
        return await self._post(box, body)

    async def complete_prompt(
        self,
        box: BoxSpec,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        json_schema: dict[str, object] | None = None,
    ) -> CompletionReport:
        """A plain one-message request (hosted profiles switch the restart warm-up off: nothing compiles)."""
        cache = self._profile(box).provider
        assert cache is not None
        prefix = Prefix(text="", token_count=0)
        return await self._post(box, self._body(box, prefix, StableRequest((), ()), prompt, cache))

    async def _post(self, box: BoxSpec, body: JsonObject) -> CompletionReport:
        response, wall = await self._http.post_json(
            box, self.completion_path, body, headers=self._headers(box)
        )
        reject_error_body(box, self.completion_path, response, unless="usage")
        return self._report(box, response, wall)


def _text_of(body: Mapping[str, Any], *path: str) -> str:
    value = dig(body, ".".join(path))
    return value if isinstance(value, str) else ""


class OpenAIHostedEngine(HostedEngine):
    """EnginePort for an OpenAI-style hosted API (`/v1/chat/completions`, automatic prompt caching)."""

    kind = "openai-hosted"
    completion_path = "/v1/chat/completions"

    def _auth_headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    @staticmethod
    def cache_key(prefix: Prefix) -> str:
        """The `prompt_cache_key` warmer sends with a prefix, and real calls of its agent should send too:
        it joins the prefix hash in routing, so the warm and the calls reach the same machine."""
        return f"warmer-{prefix.hash[:16]}"

    def _body(
        self, box: BoxSpec, prefix: Prefix, stable: StableRequest, message: str, cache: ProviderCache
    ) -> JsonObject:
        body: JsonObject = {
            "model": self._model_name(box),
            "messages": [*(dict(m) for m in stable.messages), {"role": "user", "content": message}],
            "max_completion_tokens": 1,
            "stream": False,
        }
        if stable.tools:
            body["tools"] = [dict(t) for t in stable.tools]
        if prefix.text:
            body["prompt_cache_key"] = self.cache_key(prefix)
        return body

    def _report(self, box: BoxSpec, body: JsonObject, wall: float) -> CompletionReport:
        path = self.completion_path
        prompt = count_field(box, path, body, "usage.prompt_tokens")
        cached = count_field(
            box,
            path,
            body,
            "usage.prompt_tokens_details.cached_tokens",
            cache_field=True,
            hint="the provider did not report cached tokens",
        )
        check_cached_within_prompt(box, path, prompt, cached)
        choices = body.get("choices")
        first = (
            choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], Mapping) else {}
        )
        return CompletionReport(
            prompt_tokens=prompt,
            cached_tokens=cached,
            wall_seconds=wall,
            text=_text_of(first, "message", "content"),
        )


def anthropic_tool(tool: Mapping[str, object]) -> dict[str, object]:
    """An agent's tool as Anthropic declares one: OpenAI's `{"type": "function", "function": {name,
    description, parameters}}` becomes `{name, description, input_schema}`; a tool already in that form is
    sent as it is."""
    function = tool.get("function")
    if tool.get("type") == "function" and isinstance(function, Mapping):
        out: dict[str, object] = {
            "name": function.get("name"),
            "input_schema": function.get("parameters", {}),
        }
        if function.get("description") is not None:
            out["description"] = function.get("description")
        return out
    return dict(tool)


class AnthropicEngine(HostedEngine):
    """EnginePort for Anthropic's Messages API: a `cache_control` breakpoint on the last stable block."""

    kind = "anthropic"
    completion_path = "/v1/messages"

    def _auth_headers(self, key: str) -> dict[str, str]:
        return {"x-api-key": key, "anthropic-version": ANTHROPIC_VERSION}

    def _body(
        self, box: BoxSpec, prefix: Prefix, stable: StableRequest, message: str, cache: ProviderCache
    ) -> JsonObject:
        breakpoint_: dict[str, object] = {"type": "ephemeral"}
        if cache.ttl is not None:
            breakpoint_["ttl"] = cache.ttl
        system = [m for m in stable.messages if m["role"] == "system"]
        turns = [m for m in stable.messages if m["role"] != "system"]
        system_blocks: list[dict[str, object]] = [{"type": "text", "text": m["content"]} for m in system]
        tools = [anthropic_tool(t) for t in stable.tools]
        messages: list[dict[str, object]] = [
            {"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in turns
        ]
        # The breakpoint goes on the last stable block, in the provider's order: tools, system, messages.
        last: list[dict[str, object]] | None = None
        if messages:
            content = messages[-1]["content"]
            assert isinstance(content, list)
            last = content
        elif system_blocks:
            last = system_blocks
        elif tools:
            last = tools
        if last is not None:
            last[-1] = {**last[-1], "cache_control": breakpoint_}
        body: JsonObject = {
            "model": self._model_name(box),
            "max_tokens": 1,
            "messages": [*messages, {"role": "user", "content": message}],
        }
        if system_blocks:
            body["system"] = system_blocks
        if tools:
            body["tools"] = tools
        return body

    def _report(self, box: BoxSpec, body: JsonObject, wall: float) -> CompletionReport:
        """Prompt tokens = input (after the breakpoint) + written + read; cached = read."""
        path = self.completion_path
        after = count_field(box, path, body, "usage.input_tokens")
        hint = "the provider did not report cache usage"
        written = count_field(
            box, path, body, "usage.cache_creation_input_tokens", cache_field=True, hint=hint
        )
        read = count_field(box, path, body, "usage.cache_read_input_tokens", cache_field=True, hint=hint)
        content = body.get("content")
        first = (
            content[0] if isinstance(content, list) and content and isinstance(content[0], Mapping) else {}
        )
        if not isinstance(body.get("usage"), Mapping):
            raise MalformedResponse(box.id, f"{path} response lacks `usage`")
        return CompletionReport(
            prompt_tokens=after + written + read,
            cached_tokens=read,
            wall_seconds=wall,
            text=_text_of(first, "text"),
            cache_note=None if read or written else "nothing was written to or read from the cache",
        )
