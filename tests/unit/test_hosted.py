"""Hosted providers' pure rules: the request form, the floor and increments, what keeping warm pays, how the
planner follows it, and the config that declares a hosted box."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from tests.unit.hosted_caches import GPT, SONNET
from tests.unit.prompt_helpers import spec, tool
from warmer.config.profiles import load_profile, load_profile_set
from warmer.config.settings import Settings
from warmer.config.tokenizer import offline_renderer, offline_tokenizer
from warmer.core.errors import ConfigError
from warmer.core.hosted import (
    KeepDecision,
    NotARequestPrefix,
    ProviderCache,
    keep_warm_decision,
    render_request,
    stable_request,
    warmable_tokens,
)
from warmer.core.model import BoxSpec, EngineKind, ModelProfile, WarmRecord, WarmState
from warmer.core.plan_actions import ProbePrefix, Retire, WarmPrefix
from warmer.core.planner import (
    BoxObservation,
    Desired,
    Observed,
    PlannerConfig,
    PrefixRef,
    WarmupStatus,
    plan,
)
from warmer.core.prefix import compute_stable_prefix
from warmer.core.warm_budget import WarmBudget
from warmer.root.engines import hosted_api_keys
from warmer.service.restart_warmup import RestartWarmup


def test_request_form_round_trips_whole_lines_and_drops_the_unfinished_one() -> None:
    messages = [
        {"role": "system", "content": "Be kind.\nAlways."},
        {"role": "user", "content": "Caller: Ana"},
    ]
    text = render_request(messages, [tool("lookup")])
    cut = text[: text.index("Caller") + 3]
    stable = stable_request(cut)
    assert stable.tools == (tool("lookup"),)
    assert stable.messages == ({"role": "system", "content": "Be kind.\nAlways."},)
    assert stable_request("") == stable_request('{"tools":[]')  # nothing whole yet
    with pytest.raises(NotARequestPrefix):
        stable_request("<|im_start|>system\nBe kind.<|im_end|>\n")


def test_stable_prefix_of_an_agent_in_the_hosted_form_ends_before_its_tail_message() -> None:
    agent = spec(blocks=(("persona", "You are Maya.\nBe kind."),), tools=(tool("lookup"),))
    profile = ModelProfile(name="h", engine=EngineKind.ANTHROPIC, tokenizer_file=None, provider=SONNET)
    stable = compute_stable_prefix(agent, offline_renderer(profile), len_tokens)
    request = stable_request(stable.text)
    assert request.messages == ({"role": "system", "content": "You are Maya.\nBe kind."},)
    assert warmable_tokens(stable.text, stable.token_count, len_tokens) == stable.text.rfind("\n") + 1


def len_tokens(text: str) -> list[int]:
    return list(text.encode())


def test_floor_and_increments() -> None:
    assert GPT.cacheable(1023) == 0  # below the floor: nothing, not a partial hit
    assert GPT.cacheable(1024) == 1024
    assert GPT.cacheable(1300) == 1280  # 128-token increments
    assert SONNET.cacheable(1300) == 1300


def test_keep_decision_figures() -> None:
    """6,000 tokens on Sonnet, touched every 240 s: a touch reads 6,000 tokens at $0.30/MTok and sends ~32
    uncached; a miss writes them at $3.75 instead of reading them at $0.30."""
    decision = keep_warm_decision(SONNET, prefix_tokens=6000, calls_per_minute=0.1, touch_seconds=240.0)
    touch_cost = (6000 * 0.3 + 32 * 3.0) / 1e6 * 60 / 240
    misses = 0.1 * math.exp(-0.1 * 5)
    assert decision.touch_cost_per_minute == pytest.approx(touch_cost)
    assert decision.misses_per_minute == pytest.approx(misses)
    assert decision.miss_savings_per_minute == pytest.approx(misses * 6000 * 3.45 / 1e6)
    assert decision.keep


@pytest.mark.parametrize(
    ("rate", "verdict"),
    [
        (0.0, "too_few_calls"),
        (0.01, "too_few_calls"),
        (0.05, "keep"),
        (0.6, "keep"),
        (1.0, "calls_keep_it_warm"),
    ],
)
def test_keeping_pays_only_between_too_few_calls_and_calls_that_keep_it_warm(
    rate: float, verdict: str
) -> None:
    assert (
        keep_warm_decision(SONNET, prefix_tokens=6000, calls_per_minute=rate, touch_seconds=240.0).verdict
        == verdict
    )


def test_without_a_write_surcharge_touching_never_pays_for_this_prefix() -> None:
    """GPT-4.1 bills a miss at the input price (no write premium) and reads at a quarter of it: the most a
    miss can save per minute (at 1 call per lifetime) stays below a touch every 240 s."""
    rates = [0.01 * i for i in range(1, 500)]
    assert not any(
        keep_warm_decision(GPT, prefix_tokens=3000, calls_per_minute=r, touch_seconds=240.0).keep
        for r in rates
    )


def test_below_the_floor_nothing_is_kept() -> None:
    assert keep_warm_decision(
        SONNET, prefix_tokens=900, calls_per_minute=0.3, touch_seconds=240.0
    ).verdict == ("below_floor")


def test_touch_interval_must_be_inside_the_lifetime() -> None:
    with pytest.raises(ValueError, match="lifetime"):
        keep_warm_decision(SONNET, prefix_tokens=6000, calls_per_minute=0.3, touch_seconds=300.0)


# -- the planner ------------------------------------------------------------------------------------------

HOSTED = ModelProfile(name="sonnet", engine=EngineKind.ANTHROPIC, keepalive_seconds=240.0, provider=SONNET)
BOX = BoxSpec("ant", "https://api.provider.test", EngineKind.ANTHROPIC, "sonnet")
CONFIG = PlannerConfig(
    budget=WarmBudget(max_concurrent=10, tokens_per_second=1e9, burst_tokens=1e9), keepalive_jitter=0.0
)


def hosted_plan(rate: float, record: WarmRecord | None, now: float = 1000.0) -> list[object]:
    desired = Desired(
        boxes={"ant": BOX},
        profiles={"sonnet": HOSTED},
        agents={"agent": PrefixRef("p1", 6000)},
        assignment={"agent": ("ant",)},
        last_activity={"agent": now},
        calls_per_minute={"agent": rate},
    )
    seen = BoxObservation(healthy=True, epoch="e1", warmup=WarmupStatus.DONE)
    warm = {} if record is None else {("ant", "e1", "p1"): record}
    return list(plan(desired, Observed(boxes={"ant": seen}, warm=warm), now, CONFIG).actions)


def verified_at(at: float) -> WarmRecord:
    return WarmRecord("ant", "e1", "p1", WarmState.WARM, 6000, verified_cached_tokens=6000, verified_at=at)


def test_planner_warms_and_touches_a_hosted_prefix_while_keeping_it_pays() -> None:
    assert [type(a) for a in hosted_plan(0.1, None)] == [WarmPrefix]
    (touch,) = [a for a in hosted_plan(0.1, verified_at(700.0)) if isinstance(a, WarmPrefix | ProbePrefix)]
    assert touch.prefix_hash == "p1"


def test_planner_leaves_a_hosted_prefix_cold_when_calls_are_too_few() -> None:
    assert hosted_plan(0.001, None) == []
    (retired,) = hosted_plan(0.001, verified_at(990.0))
    assert isinstance(retired, Retire)
    assert "too few calls for keepalive touches to cost less than the misses they save" in retired.reason


def test_planner_sends_no_touch_where_the_calls_keep_it_warm() -> None:
    assert [type(a) for a in hosted_plan(5.0, None)] == [WarmPrefix]
    assert hosted_plan(5.0, verified_at(700.0)) == []  # due for a touch by time, but it would only cost


# -- config -----------------------------------------------------------------------------------------------


def test_shipped_hosted_profiles_carry_their_provider_rules() -> None:
    profiles = load_profile_set()
    claude = profiles["claude-sonnet-4.5"].provider
    assert claude is not None
    assert (claude.min_cacheable_tokens, claude.ttl, claude.cache_write_price / claude.input_price) == (
        1024,
        "5m",
        1.25,
    )
    gpt = profiles["openai-gpt-4.1"].provider
    assert gpt is not None
    assert (gpt.min_cacheable_tokens, gpt.increment_tokens) == (1024, 128)
    assert offline_tokenizer(profiles["openai-gpt-4.1"])("a")  # a hosted profile still counts offline


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            'engine = "vllm"\n[provider]\nmin_cacheable_tokens = 1\nlifetime_seconds = 1\ninput_price = 1\n'
            "cache_write_price = 1\ncache_read_price = 1\n",
            "[provider] table goes with engine",
        ),
        ('engine = "anthropic"\n', "[provider] table goes with engine"),
        (
            'engine = "anthropic"\nkeepalive_seconds = 400\n[provider]\nmin_cacheable_tokens = 1024\n'
            "lifetime_seconds = 300\ninput_price = 3\ncache_write_price = 3.75\ncache_read_price = 0.3\n",
            "keepalive_seconds must be shorter",
        ),
    ],
)
def test_profile_provider_table_is_checked(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_profile(path)
    assert any(problem in message for _, message in caught.value.problems)


def hosted_box(**extra: object) -> dict[str, object]:
    return {
        "id": "ant",
        "base_url": "https://api.anthropic.com",
        "engine": "anthropic",
        "model": "m",
        **extra,
    }


def test_a_hosted_box_names_its_key_variable_and_only_hosted_boxes_do() -> None:
    with pytest.raises(ValueError, match="needs api_key_env"):
        Settings(fleet={"boxes": [hosted_box()]})
    with pytest.raises(ValueError, match="for hosted boxes only"):
        Settings(fleet={"boxes": [{**hosted_box(api_key_env="K"), "engine": "vllm"}]})


def test_keys_come_from_the_environment_and_a_missing_one_names_the_field_not_a_value() -> None:
    settings = Settings(fleet={"boxes": [hosted_box(api_key_env="ANTHROPIC_KEY_FOR_TEST")]})
    assert hosted_api_keys(settings, {"ANTHROPIC_KEY_FOR_TEST": "sk-1"}) == {"ant": "sk-1"}
    with pytest.raises(ConfigError) as caught:
        hosted_api_keys(settings, {})
    assert caught.value.problems == [
        ("fleet.boxes[0].api_key_env", "environment variable ANTHROPIC_KEY_FOR_TEST is unset")
    ]


class _Untouchable:
    """An engine or store that fails the test on any use."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"{name} was used")


class _Clock:
    def monotonic(self) -> float:
        return 0.0

    def now(self) -> float:
        return 0.0


def test_a_hosted_box_gets_no_restart_warm_up_requests() -> None:
    """Nothing of a hosted model loads on first use on our side, and each request is billed: the restart
    warm-up of a hosted box sends nothing, though its profile keeps the default recipe (long prefill too)."""
    warmup = RestartWarmup(_Untouchable(), _Untouchable(), _Clock())  # type: ignore[arg-type]
    outcome = asyncio.run(warmup.run(BOX, HOSTED, "e1", longest_prefix=6000))
    assert outcome.ok
    assert outcome.phases == ()


def test_the_readme_figures_of_the_keep_rule() -> None:
    """README "Keeping warm only while it pays": the shipped profiles, 6,000 tokens, a touch every 240 s."""
    profiles = load_profile_set()
    sonnet, gpt = profiles["claude-sonnet-4.5"].provider, profiles["openai-gpt-4.1"].provider
    assert sonnet is not None
    assert gpt is not None

    def decide(cache: ProviderCache, rate: float) -> KeepDecision:
        return keep_warm_decision(cache, prefix_tokens=6000, calls_per_minute=rate, touch_seconds=240.0)

    rates = [i / 1000 for i in range(1, 3000)]
    kept = [r for r in rates if decide(sonnet, r).keep]
    assert (kept[0], kept[-1]) == (0.027, 0.677)
    assert decide(sonnet, 0.1).touch_cost_per_minute == pytest.approx(0.000474, abs=1e-6)
    assert decide(sonnet, 0.1).miss_savings_per_minute == pytest.approx(0.001256, abs=1e-6)
    best = max(decide(gpt, r).miss_savings_per_minute for r in rates)
    assert best == pytest.approx(0.00066, abs=1e-5)
    assert best < decide(gpt, 0.2).touch_cost_per_minute == pytest.approx(0.000766, abs=1e-6)
