"""Generic OpenAI-compatible adapter contract over httpx.MockTransport, with documented shapes."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.unit.engine_shapes import (
    FAST_RETRY,
    SHORT_TIMEOUTS,
    VLLM_METRICS,
    Script,
    box,
    openai_completion,
    run,
)
from warmer.adapters.engines.http import EngineRejected
from warmer.adapters.engines.openai import OpenAICompatibleEngine
from warmer.core.errors import (
    CacheFieldMissing,
    EngineDown,
    EngineSlow,
    EngineUnavailable,
    HealthFailure,
    MalformedResponse,
    NotSupported,
)
from warmer.core.model import EngineKind, ModelProfile, Prefix
from warmer.service.engine_work.warming import WarmExecutor
from warmer.testing import PROBE_MARK

BOX = box(EngineKind.OPENAI)
PREFIX = Prefix(
    text="System: you book dental appointments.\n" * 10, token_count=200, token_ids=tuple(range(200))
)
MODELS = {"object": "list", "data": [{"id": "served-m", "object": "model", "owned_by": "x"}]}


class StepClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        self.t += 0.001
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


def engine(script: Script, **kwargs: object) -> OpenAICompatibleEngine:
    return OpenAICompatibleEngine(script.client(), timeouts=SHORT_TIMEOUTS, retry=FAST_RETRY, **kwargs)  # type: ignore[arg-type]


def test_completion_sends_text_with_discovered_model_and_reads_usage() -> None:
    script = (
        Script().on("GET", "/v1/models", MODELS).on("POST", "/v1/completions", openai_completion(210, 192))
    )
    report = run(engine(script).complete_prefix(BOX, PREFIX, suffix="\nUser: hi"))
    assert (report.prompt_tokens, report.cached_tokens, report.text) == (210, 192, "!")
    [sent] = script.bodies("/v1/completions")
    # Text, not ids: a generic server's tokenizer is unknown, and warm and probe must agree.
    assert sent == {
        "prompt": PREFIX.text + "\nUser: hi",
        "max_tokens": 1,
        "temperature": 0.0,
        "stream": False,
        "model": "served-m",
    }


def test_configured_served_model_name_wins_without_discovery() -> None:
    script = Script().on("POST", "/v1/completions", openai_completion(10, 0))
    run(engine(script, served_models={"m": "my-served"}).complete_prefix(BOX, PREFIX))
    assert script.bodies("/v1/completions")[0]["model"] == "my-served"
    assert script.count("/v1/models") == 0


def test_missing_cache_details_is_cache_field_missing() -> None:
    body = openai_completion(210, None, details=False)  # usage without prompt_tokens_details at all
    script = Script().on("GET", "/v1/models", MODELS).on("POST", "/v1/completions", body)
    with pytest.raises(CacheFieldMissing, match=r"prompt_tokens_details\.cached_tokens"):
        run(engine(script).complete_prefix(BOX, PREFIX))


def test_null_cache_details_is_zero_cached_with_a_note() -> None:
    """`prompt_tokens_details: null` is what vLLM (truthiness check, serving_completion.py @ 2d5f987d) and
    older SGLang OpenAI routes send for 0 cached tokens: a cold prefix, not a missing field."""
    body = openai_completion(210, None)
    script = Script().on("GET", "/v1/models", MODELS).on("POST", "/v1/completions", body)
    report = run(engine(script).complete_prefix(BOX, PREFIX))
    assert (report.prompt_tokens, report.cached_tokens) == (210, 0)
    assert report.cache_note is not None
    assert "prompt_tokens_details: null" in report.cache_note


def test_null_details_probe_is_a_miss_whose_reason_names_both_readings() -> None:
    script = (
        Script().on("GET", "/v1/models", MODELS).on("POST", "/v1/completions", openai_completion(210, None))
    )
    profile = ModelProfile(name="m", engine=EngineKind.OPENAI)
    outcome = run(WarmExecutor(engine(script), StepClock()).warm_and_verify(BOX, profile, PREFIX))
    assert not outcome.verified
    assert outcome.cached_tokens == 0
    assert outcome.reason is not None
    assert "probe saw 0 cached" in outcome.reason
    assert "cache reporting is off" in outcome.reason


def test_missing_usage_is_malformed() -> None:
    body = openai_completion(5, 0)
    del body["usage"]
    script = Script().on("GET", "/v1/models", MODELS).on("POST", "/v1/completions", body)
    with pytest.raises(MalformedResponse, match=r"usage\.prompt_tokens"):
        run(engine(script).complete_prefix(BOX, PREFIX))


@pytest.mark.parametrize(
    "content",
    [b"", b"null", b"Internal error", b'{"usage": {"prompt_tokens": true, "prompt_tokens_details": {}}}'],
)
def test_garbage_bodies_are_malformed(content: bytes) -> None:
    script = Script().on("GET", "/v1/models", MODELS)
    script.on("POST", "/v1/completions", httpx.Response(200, content=content))
    with pytest.raises(MalformedResponse):
        run(engine(script).complete_prefix(BOX, PREFIX))


def test_5xx_then_success_via_retry_and_4xx_never_retried() -> None:
    script = Script().on("GET", "/v1/models", MODELS)
    script.on(
        "POST", "/v1/completions", httpx.Response(502), httpx.Response(200, json=openai_completion(210, 200))
    )
    eng = engine(script)
    assert run(eng.complete_prefix(BOX, PREFIX)).cached_tokens == 200
    assert script.count("/v1/completions") == 2

    script.on("POST", "/v1/completions", httpx.Response(422, json={"detail": "prompt too long"}))
    with pytest.raises(EngineRejected, match="HTTP 422"):
        run(eng.complete_prefix(BOX, PREFIX))
    assert script.count("/v1/completions") == 3


def test_timeout_on_every_attempt_is_unavailable() -> None:
    script = Script().on("GET", "/v1/models", MODELS).on("POST", "/v1/completions", httpx.ReadTimeout("slow"))
    with pytest.raises(EngineUnavailable, match="timed out"):
        run(engine(script).complete_prefix(BOX, PREFIX))
    assert script.count("/v1/completions") == FAST_RETRY.attempts


def test_health_falls_back_to_models_when_no_health_route() -> None:
    script = Script().on("GET", "/v1/models", MODELS)  # /health answers 404 (unrouted)
    assert run(engine(script).health(BOX)) is True
    down = Script().on("GET", "/health", httpx.ConnectError("refused"))
    with pytest.raises(EngineDown) as caught:
        run(engine(down).health(BOX))
    assert caught.value.kind is HealthFailure.UNREACHABLE


def test_epoch_from_process_start_time_when_exposed() -> None:
    script = Script().on("GET", "/metrics", httpx.Response(200, text=VLLM_METRICS))
    assert run(engine(script).epoch(BOX)) == "openai-start-1764470000.0"


def test_epoch_from_configured_header() -> None:
    script = Script().on(
        "GET", "/v1/models", httpx.Response(200, json=MODELS, headers={"x-instance": "pod-7"})
    )
    assert run(engine(script, epoch_header="x-instance").epoch(BOX)) == "openai-header-pod-7"


def test_epoch_without_identity_changes_after_a_health_bounce_and_per_adapter_instance() -> None:
    script = Script().on("GET", "/v1/models", MODELS).on("GET", "/health", httpx.Response(200))
    eng = engine(script)
    first = run(eng.epoch(BOX))
    assert run(eng.epoch(BOX)) == first
    script.on("GET", "/health", httpx.Response(503), httpx.Response(200))
    with pytest.raises(EngineDown, match="answered 503") as caught:
        run(eng.health(BOX))
    assert caught.value.kind is HealthFailure.HTTP_STATUS
    assert run(eng.health(BOX)) is True
    assert run(eng.epoch(BOX)) != first
    # A new adapter (warmer restarted) cannot vouch the engine did not restart meanwhile.
    assert run(engine(script).epoch(BOX)) != run(eng.epoch(BOX))


def test_a_late_health_answer_is_slow_not_down_and_no_restart() -> None:
    """A box that takes the connection but answers /health too late is busy, not known to be down: the
    adapter says so (EngineSlow) and its restart watch does not count a bounce; a connect timeout or a
    refused connection is down."""
    script = Script().on("GET", "/v1/models", MODELS).on("GET", "/health", httpx.ReadTimeout("busy"))
    eng = engine(script)
    first = run(eng.epoch(BOX))
    with pytest.raises(EngineSlow, match="timed out"):
        run(eng.health(BOX))
    script.on("GET", "/health", httpx.Response(200))
    assert run(eng.health(BOX)) is True
    assert run(eng.epoch(BOX)) == first  # the same process: a late answer was no bounce
    script.on("GET", "/health", httpx.ConnectTimeout("no route"))
    with pytest.raises(EngineDown) as caught:
        run(eng.health(BOX))
    assert caught.value.kind is HealthFailure.CONNECT_TIMEOUT


def test_a_request_answered_too_late_is_slow_and_one_never_connected_is_only_unavailable() -> None:
    late = Script().on("GET", "/v1/models", MODELS).on("POST", "/v1/completions", httpx.ReadTimeout("slow"))
    with pytest.raises(EngineSlow):
        run(engine(late).complete_prefix(BOX, PREFIX))
    never = Script().on("GET", "/v1/models", MODELS).on("POST", "/v1/completions", httpx.ConnectTimeout("x"))
    with pytest.raises(EngineUnavailable, match="no connection") as caught:
        run(engine(never).complete_prefix(BOX, PREFIX))
    assert not isinstance(caught.value, EngineSlow)


def test_constrained_request_carries_the_schema() -> None:
    script = Script().on("GET", "/v1/models", MODELS).on("POST", "/v1/completions", openai_completion(9, 0))
    schema: dict[str, object] = {"type": "object"}
    run(
        engine(script).complete_prompt(
            BOX, "Reply in JSON", max_tokens=8, temperature=0.7, json_schema=schema
        )
    )
    sent = script.bodies("/v1/completions")[0]
    assert sent["response_format"]["json_schema"]["schema"] == schema
    assert sent["temperature"] == 0.7
    assert sent["max_tokens"] == 8


def test_cache_stats_reads_known_counters_else_not_supported() -> None:
    script = Script().on("GET", "/metrics", httpx.Response(200, text=VLLM_METRICS))
    stats = run(engine(script).cache_stats(BOX))
    assert (stats.queried_tokens, stats.hit_tokens) == (2048.0, 1536.0)
    with pytest.raises(NotSupported):
        run(engine(Script()).cache_stats(BOX))
    garbage = Script().on("GET", "/metrics", httpx.Response(200, text="not metrics at all {{{\n"))
    with pytest.raises(MalformedResponse):
        run(engine(garbage).cache_stats(BOX))


def test_dense_warm_then_probe_verifies_within_block_granularity() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        prompt = json.loads(request.content)["prompt"]
        if PROBE_MARK in prompt:
            return httpx.Response(200, json=openai_completion(215, 128))  # whole blocks of 128
        return httpx.Response(200, json=openai_completion(200, 0))

    script = Script().on("GET", "/v1/models", MODELS).on("POST", "/v1/completions", answer)
    profile = ModelProfile(name="m", engine=EngineKind.OPENAI, block_tokens=128)
    outcome = run(WarmExecutor(engine(script), StepClock()).warm_and_verify(BOX, profile, PREFIX))
    assert outcome.verified, outcome.reason
    assert (outcome.cached_tokens, outcome.prefix_tokens, outcome.requests_sent) == (128, 200, 2)
    assert outcome.wall_seconds > 0

    profile_fine = ModelProfile(name="m", engine=EngineKind.OPENAI, block_tokens=16)
    outcome = run(WarmExecutor(engine(script), StepClock()).warm_and_verify(BOX, profile_fine, PREFIX))
    assert not outcome.verified
    assert outcome.reason is not None
    assert "need >= 184" in outcome.reason


def test_probe_with_fewer_prompt_tokens_than_the_prefix_is_not_verified() -> None:
    script = Script().on("GET", "/v1/models", MODELS).on("POST", "/v1/completions", openai_completion(50, 50))
    profile = ModelProfile(name="m", engine=EngineKind.OPENAI)
    outcome = run(WarmExecutor(engine(script), StepClock()).probe(BOX, profile, PREFIX))
    assert not outcome.verified
    assert outcome.reason is not None
    assert "counted 50 prompt tokens, fewer than the 200-token prefix sent" in outcome.reason
