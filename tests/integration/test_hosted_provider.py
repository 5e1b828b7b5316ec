"""Hosted-provider boxes against a local provider server that implements the documented cache rules.

The server (`testbed.hosted_provider`) answers OpenAI's Chat Completions and Anthropic's Messages on
loopback with the rules of their prompt-caching guides (https://developers.openai.com/api/docs/guides/
prompt-caching, https://platform.claude.com/docs/en/build-with-claude/prompt-caching): a minimum cacheable
length, 128-token increments (OpenAI), breakpoints and TTLs (Anthropic), routing by prefix and
`prompt_cache_key`, and a lifetime after the last use, on a virtual clock. warmer's own config path builds
the boxes (keys from the environment), and the warm executor warms, verifies and finds a prefix gone once
the provider's lifetime has passed; whether keeping it warm pays is the planner's rule.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from testbed.hosted_provider import (
    HostedProvider,
    ProviderRules,
    hosted_provider,
    machine_for,
    render_openai,
)
from warmer.adapters.engines.hosted import OpenAIHostedEngine
from warmer.config.profiles import load_profile_set
from warmer.config.settings import Settings
from warmer.config.tokenizer import offline_renderer, offline_tokenizer
from warmer.core.agent_requests import build_request, sample_values
from warmer.core.agents import AgentSpec, DynamicTail, Placeholder, StaticBlock
from warmer.core.errors import EngineDown, HealthFailure
from warmer.core.hosted import keep_warm_decision
from warmer.core.lint import lint_agent
from warmer.core.model import BoxSpec, ModelProfile, Prefix
from warmer.core.prefix import compute_stable_prefix
from warmer.root.engines import SystemClock, build_engine_dispatcher, engine_http_client
from warmer.service.engine_work.warming import WarmExecutor, WarmOutcome

PROFILES = load_profile_set()
OPENAI = PROFILES["openai-gpt-4.1"]
ANTHROPIC = PROFILES["claude-sonnet-4.5"]
KEY = "sk-local-provider-key-4242"
KEY_ENV = "WARMER_TEST_HOSTED_KEY"
RULE = "Always confirm the caller's consent before you discuss an offer, and never promise a price."
TOOL = {
    "type": "function",
    "function": {
        "name": "schedule_callback",
        "description": "Book a callback at a time the customer chose.",
        "parameters": {"type": "object", "properties": {"when": {"type": "string"}}, "required": ["when"]},
    },
}


def agent(profile: ModelProfile, rules: int) -> AgentSpec:
    """An agent whose static system text is `rules` lines long (about 100 provider tokens each)."""
    persona = "You are Maya, an outbound sales agent for Northwind Mobile.\n" + "\n".join(
        f"{i}. {RULE}" for i in range(rules)
    )
    return AgentSpec(
        id="outbound",
        model=profile.name,
        blocks=(StaticBlock("persona", persona),),
        tail=DynamicTail("Caller: {customer_name}\nNow: {now}"),
        placeholders=(Placeholder("customer_name", "name"), Placeholder("now", "datetime")),
        tools=(TOOL,),
    )


def prefix_of(spec: AgentSpec, profile: ModelProfile) -> Prefix:
    return compute_stable_prefix(spec, offline_renderer(profile), offline_tokenizer(profile)).as_prefix()


@pytest.fixture
def provider() -> Iterator[HostedProvider]:
    with hosted_provider(ProviderRules(api_key=KEY)) as running:
        yield running


def run_executor(
    provider: HostedProvider, monkeypatch: pytest.MonkeyPatch, profile: ModelProfile, steps: list[object]
) -> list[WarmOutcome]:
    """Each step: a Prefix to warm and verify, ("probe", Prefix), or seconds (float) to move the provider's
    clock on. Boxes and keys come from warmer's own settings, as `warmer serve` builds them."""
    monkeypatch.setenv(KEY_ENV, KEY)
    box_settings = {
        "id": "hosted",
        "base_url": provider.base_url,
        "engine": profile.engine.value,
        "model": profile.name,
        "api_key_env": KEY_ENV,
    }
    settings = Settings(fleet={"boxes": [box_settings]})
    (box,) = settings.box_specs(PROFILES)

    async def go() -> list[WarmOutcome]:
        outcomes = []
        async with engine_http_client(settings) as client:
            engine = build_engine_dispatcher(settings, client, boxes=[box], profiles=PROFILES)
            executor = WarmExecutor(engine, SystemClock())
            assert await engine.health(box)
            for step in steps:
                if isinstance(step, float):
                    provider.advance(step)
                elif isinstance(step, tuple):
                    outcomes.append(await executor.probe(box, profile, step[1]))
                else:
                    assert isinstance(step, Prefix)
                    outcomes.append(await executor.warm_and_verify(box, profile, step))
        return outcomes

    return asyncio.run(go())


def test_openai_box_warms_verifies_and_loses_the_prefix_after_the_lifetime(
    provider: HostedProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = prefix_of(agent(OPENAI, rules=30), OPENAI)
    warm, kept, refreshed, gone = run_executor(
        provider,
        monkeypatch,
        OPENAI,
        [prefix, 200.0, ("probe", prefix), 299.0, ("probe", prefix), 301.0, ("probe", prefix)],
    )
    assert warm.verified, warm.describe()
    assert warm.cached_tokens is not None
    assert warm.cached_tokens >= 1024
    assert warm.cached_tokens % 128 == 0  # the documented 128-token increments
    assert kept.verified
    assert refreshed.verified
    assert not gone.verified
    assert gone.cached_tokens == 0
    bodies = [r["body"] for r in provider.requests]
    assert {b["prompt_cache_key"] for b in bodies} == {f"warmer-{prefix.hash[:16]}"}
    assert all(b["max_completion_tokens"] == 1 and b["tools"] == [TOOL] for b in bodies)
    assert bodies[0]["messages"][0]["role"] == "system"
    assert bodies[0]["messages"][-1] == {"role": "user", "content": "."}


def test_anthropic_box_writes_at_the_breakpoint_then_reads_it(
    provider: HostedProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = prefix_of(agent(ANTHROPIC, rules=30), ANTHROPIC)
    warm, gone = run_executor(provider, monkeypatch, ANTHROPIC, [prefix, 301.0, ("probe", prefix)])
    assert warm.verified, warm.describe()
    assert not gone.verified
    assert gone.cached_tokens == 0
    first = provider.requests[0]["body"]
    assert first["max_tokens"] == 1
    assert first["system"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "5m"}
    assert first["tools"] == [
        {
            "name": "schedule_callback",
            "description": "Book a callback at a time the customer chose.",
            "input_schema": TOOL["function"]["parameters"],  # type: ignore[index]
        }
    ]


def test_a_prefix_below_the_floor_warms_nothing_and_the_lint_says_so(
    provider: HostedProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = agent(ANTHROPIC, rules=3)
    (warm,) = run_executor(provider, monkeypatch, ANTHROPIC, [prefix_of(spec, ANTHROPIC)])
    assert not warm.verified
    assert warm.cached_tokens == 0
    assert provider.requests[-1]["body"]["system"][-1]["cache_control"]["type"] == "ephemeral"
    report = lint_agent(
        spec, offline_renderer(ANTHROPIC), offline_tokenizer(ANTHROPIC), provider=ANTHROPIC.provider
    )
    (finding,) = [f for f in report.findings if f.code == "below-provider-cache-floor"]
    assert "minimum cacheable length of 1024" in finding.message
    assert finding.severity == "warning"  # no layout change would reach the floor


def test_a_wrong_key_is_refused_and_never_shown(
    provider: HostedProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-wrong-key-1111")
    box = BoxSpec("hosted", provider.base_url, OPENAI.engine, OPENAI.name)
    settings = Settings(
        fleet={
            "boxes": [
                {
                    "id": "hosted",
                    "base_url": provider.base_url,
                    "engine": "openai-hosted",
                    "model": OPENAI.name,
                    "api_key_env": KEY_ENV,
                }
            ]
        }
    )

    async def go() -> tuple[EngineDown, WarmOutcome]:
        async with engine_http_client(settings) as client:
            engine = build_engine_dispatcher(settings, client, boxes=[box], profiles=PROFILES)
            with pytest.raises(EngineDown) as down:
                await engine.health(box)
            outcome = await WarmExecutor(engine, SystemClock()).warm_and_verify(
                box, OPENAI, prefix_of(agent(OPENAI, rules=30), OPENAI)
            )
            return down.value, outcome

    down, outcome = asyncio.run(go())
    assert down.kind is HealthFailure.HTTP_STATUS  # a rejected key is down, not slow
    assert "401" in str(down)
    assert "sk-wrong-key-1111" not in str(down)
    assert not outcome.verified
    assert outcome.reason is not None
    assert "401" in outcome.reason
    assert "sk-wrong-key-1111" not in outcome.reason
    assert provider.requests == []


def test_keeping_warm_pays_only_in_a_band_of_call_rates() -> None:
    """The README's figures: a 6,000-token prefix on Claude Sonnet 4.5 (5-minute TTL), touched every 240 s."""
    assert ANTHROPIC.provider is not None

    def verdict(rate: float) -> str:
        return keep_warm_decision(
            ANTHROPIC.provider,
            prefix_tokens=6000,
            calls_per_minute=rate,
            touch_seconds=240.0,  # type: ignore[arg-type]
        ).verdict

    assert verdict(0.01) == "too_few_calls"
    assert verdict(0.1) == "keep"
    assert verdict(0.5) == "keep"
    assert verdict(2.0) == "calls_keep_it_warm"


def test_the_cache_key_takes_the_agents_calls_to_the_machine_the_warm_filled(
    provider: HostedProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Routing hashes the prompt's first 256 tokens with `prompt_cache_key`: a turn-1 call that sends
    warmer's key for its agent lands where the warm went and reads the whole stable request; the same call
    under another key lands on another machine and reads nothing."""
    spec = agent(OPENAI, rules=30)
    prefix = prefix_of(spec, OPENAI)
    (warm,) = run_executor(provider, monkeypatch, OPENAI, [prefix])
    assert warm.verified
    request = build_request(spec, sample_values(spec, 7))  # a call the prefix computation never rendered
    call = {"model": "gpt-4.1", "messages": list(request.messages), "tools": list(request.tools)}
    headers = {"Authorization": f"Bearer {KEY}"}
    rendered = render_openai(call)

    def route(key: str) -> str:
        """The machine a call under `key` goes to, asked without sending it (a call would write there)."""
        return str(machine_for(provider.rules, rendered, key))

    def send(key: str) -> tuple[str, int]:
        answer = httpx.post(
            f"{provider.base_url}/v1/chat/completions",
            json={**call, "prompt_cache_key": key},
            headers=headers,
            timeout=10,
        )
        answer.raise_for_status()
        usage = answer.json()["usage"]
        return answer.headers["x-testbed-machine"], usage["prompt_tokens_details"]["cached_tokens"]

    warmed_on, cached = send(OpenAIHostedEngine.cache_key(prefix))
    # the whole stable request, within the 128-token increment and the final message's framing
    assert cached >= warm.prefix_tokens - 160
    first_elsewhere = next(key for key in (f"other-{i}" for i in range(64)) if route(key) != warmed_on)
    assert send(first_elsewhere) == (str(1 - int(warmed_on)), 0)  # another machine: nothing cached there
