"""Hosted-provider adapters over httpx.MockTransport: the request shapes and usage fields of the providers'
API references, the key in the header only, and answers that cannot be trusted refused.

Shapes: OpenAI Chat Completions (https://platform.openai.com/docs/api-reference/chat/create; usage as in
https://developers.openai.com/api/docs/guides/prompt-caching: `usage.prompt_tokens_details.cached_tokens`);
Anthropic Messages (https://platform.claude.com/docs/en/api/messages; breakpoints and usage as in
https://platform.claude.com/docs/en/build-with-claude/prompt-caching: `cache_control` on a block,
`input_tokens` + `cache_creation_input_tokens` + `cache_read_input_tokens`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import pytest

from tests.unit.engine_shapes import FAST_RETRY, SHORT_TIMEOUTS, Script, run
from tests.unit.hosted_caches import GPT, SONNET
from warmer.adapters.engines.hosted import AnthropicEngine, HostedEngine, OpenAIHostedEngine, anthropic_tool
from warmer.core.errors import (
    CacheFieldMissing,
    EngineDown,
    EngineError,
    HealthFailure,
    MalformedResponse,
    NotSupported,
)
from warmer.core.hosted import render_request
from warmer.core.model import BoxSpec, EngineKind, ModelProfile, Prefix

KEY = "sk-unit-secret-9876"
CACHE = GPT
CLAUDE_CACHE = replace(SONNET, ttl="1h", lifetime_seconds=3600.0, cache_write_price=6.0)  # 1-h writes: 2x
PROFILES = {
    "gpt": ModelProfile(
        name="gpt", engine=EngineKind.OPENAI_HOSTED, served_model_name="gpt-x", provider=CACHE
    ),
    "claude": ModelProfile(
        name="claude", engine=EngineKind.ANTHROPIC, served_model_name="claude-x", provider=CLAUDE_CACHE
    ),
}
OPENAI_BOX = BoxSpec("oai", "https://api.provider.test", EngineKind.OPENAI_HOSTED, "gpt")
CLAUDE_BOX = BoxSpec("ant", "https://api.provider.test", EngineKind.ANTHROPIC, "claude")
TOOL = {
    "type": "function",
    "function": {"name": "lookup", "description": "Finds.", "parameters": {"type": "object"}},
}
SYSTEM = "You are Maya. " * 100
FEW_SHOT = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]


def prefix(messages: list[dict[str, object]], tools: list[dict[str, object]]) -> Prefix:
    """A stable prefix as the hosted form renders it, cut inside the tail message (its first value)."""
    text = render_request([*messages, {"role": "user", "content": "Caller: Ana"}], tools)
    return Prefix(text=text[: text.index("Caller: ") + len("Caller: ")], token_count=999)


def openai_answer(prompt: int, cached: int | None) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached, "audio_tokens": 0}
    return {
        "id": "c1",
        "object": "chat.completion",
        "choices": [{"message": {"content": "ok"}}],
        "usage": usage,
    }


def claude_answer(after: int, written: int, read: int) -> dict[str, Any]:
    usage = {
        "input_tokens": after,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
        "output_tokens": 1,
    }
    return {"id": "m1", "type": "message", "content": [{"type": "text", "text": "ok"}], "usage": usage}


def make(kind: type[HostedEngine], script: Script) -> HostedEngine:
    return kind(
        script.client(),
        profiles=PROFILES,
        api_keys={"oai": KEY, "ant": KEY},
        timeouts=SHORT_TIMEOUTS,
        retry=FAST_RETRY,
    )


def test_openai_sends_the_stable_messages_tools_and_cache_key_and_reads_cached_tokens() -> None:
    script = Script().on("POST", "/v1/chat/completions", openai_answer(1400, 1280))
    stable = prefix([{"role": "system", "content": SYSTEM}, *FEW_SHOT], [TOOL])
    report = run(make(OpenAIHostedEngine, script).complete_prefix(OPENAI_BOX, stable, suffix="\n#probe ab12"))
    assert (report.prompt_tokens, report.cached_tokens) == (1400, 1280)
    (body,) = script.bodies("/v1/chat/completions")
    assert body["model"] == "gpt-x"
    assert body["messages"] == [
        {"role": "system", "content": SYSTEM},
        *FEW_SHOT,
        {"role": "user", "content": "#probe ab12"},  # the unfinished tail line is never sent
    ]
    assert body["tools"] == [TOOL]
    assert body["max_completion_tokens"] == 1
    assert body["prompt_cache_key"] == f"warmer-{stable.hash[:16]}"
    assert script.calls[0].headers["authorization"] == f"Bearer {KEY}"


def test_openai_without_cached_tokens_is_a_missing_cache_field_never_zero() -> None:
    script = Script().on("POST", "/v1/chat/completions", openai_answer(1400, None))
    stable = prefix([{"role": "system", "content": SYSTEM}], [])
    with pytest.raises(CacheFieldMissing):
        run(make(OpenAIHostedEngine, script).complete_prefix(OPENAI_BOX, stable))


def test_openai_cached_above_prompt_is_malformed() -> None:
    script = Script().on("POST", "/v1/chat/completions", openai_answer(1000, 1280))
    with pytest.raises(MalformedResponse):
        run(make(OpenAIHostedEngine, script).complete_prefix(OPENAI_BOX, prefix([], [])))


def test_anthropic_puts_the_breakpoint_on_the_last_stable_block_with_the_profile_ttl() -> None:
    script = Script().on("POST", "/v1/messages", claude_answer(8, 1500, 0), claude_answer(9, 0, 1500))
    engine = make(AnthropicEngine, script)
    stable = prefix([{"role": "system", "content": SYSTEM}, *FEW_SHOT], [TOOL])
    warm = run(engine.complete_prefix(CLAUDE_BOX, stable))
    probe = run(engine.complete_prefix(CLAUDE_BOX, stable, suffix="\n#probe ab12"))
    assert (warm.prompt_tokens, warm.cached_tokens) == (1508, 0)
    assert (probe.prompt_tokens, probe.cached_tokens) == (1509, 1500)
    body = script.bodies("/v1/messages")[0]
    breakpoint_ = {"type": "ephemeral", "ttl": "1h"}
    assert body["system"] == [{"type": "text", "text": SYSTEM}]  # the breakpoint is later: on the few-shot
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello!", "cache_control": breakpoint_}]},
        {"role": "user", "content": "."},
    ]
    assert body["tools"] == [{"name": "lookup", "description": "Finds.", "input_schema": {"type": "object"}}]
    assert body["max_tokens"] == 1
    headers = script.calls[0].headers
    assert (headers["x-api-key"], headers["anthropic-version"]) == (KEY, "2023-06-01")


@pytest.mark.parametrize(
    ("messages", "where"),
    [([{"role": "system", "content": SYSTEM}], "system"), ([], "tools")],
)
def test_anthropic_breakpoint_falls_back_to_the_system_then_the_tools(
    messages: list[dict[str, object]], where: str
) -> None:
    script = Script().on("POST", "/v1/messages", claude_answer(8, 1500, 0))
    run(make(AnthropicEngine, script).complete_prefix(CLAUDE_BOX, prefix(messages, [TOOL])))
    (body,) = script.bodies("/v1/messages")
    assert body[where][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}


def test_anthropic_without_cache_usage_is_a_missing_cache_field() -> None:
    answer = claude_answer(8, 0, 0)
    del answer["usage"]["cache_read_input_tokens"]
    script = Script().on("POST", "/v1/messages", answer)
    with pytest.raises(CacheFieldMissing):
        run(make(AnthropicEngine, script).complete_prefix(CLAUDE_BOX, prefix([], [TOOL])))


def test_a_refused_key_is_an_error_that_never_names_the_key() -> None:
    refused = httpx.Response(401, json={"type": "error", "error": {"type": "authentication_error"}})
    script = Script().on("POST", "/v1/messages", refused).on("GET", "/v1/models", refused)
    engine = make(AnthropicEngine, script)
    with pytest.raises(EngineDown) as down:
        run(engine.health(CLAUDE_BOX))
    assert down.value.kind is HealthFailure.HTTP_STATUS
    assert "answered 401" in str(down.value)
    assert KEY not in str(down.value)
    with pytest.raises(EngineError) as caught:
        run(engine.complete_prefix(CLAUDE_BOX, prefix([], [TOOL])))
    assert "401" in str(caught.value)
    assert KEY not in str(caught.value)
    assert KEY not in repr(engine)


def test_a_box_without_a_key_sends_nothing() -> None:
    script = Script()
    engine = OpenAIHostedEngine(script.client(), profiles=PROFILES, api_keys={}, timeouts=SHORT_TIMEOUTS)
    with pytest.raises(EngineError, match="no API key"):
        run(engine.complete_prefix(OPENAI_BOX, prefix([], [])))
    assert script.calls == []


def test_a_prefix_in_another_form_is_not_supported() -> None:
    script = Script()
    with pytest.raises(NotSupported, match="hosted form"):
        run(
            make(OpenAIHostedEngine, script).complete_prefix(
                OPENAI_BOX, Prefix("<|im_start|>system\nHi\n", 9)
            )
        )
    assert script.calls == []


def test_layout_says_the_provider_counts_its_own_tokens_within_increment_and_final_message() -> None:
    layout = run(make(OpenAIHostedEngine, Script()).cache_layout(OPENAI_BOX))
    assert layout.counts_own_tokens
    assert layout.page_tokens == 128 + 32


def test_an_anthropic_style_tool_is_sent_as_it_is() -> None:
    native = {"name": "lookup", "description": "Finds.", "input_schema": {"type": "object"}}
    assert anthropic_tool(native) == native
