"""SGLang adapter contract: documented /generate shapes in, typed reports or typed errors out."""

from __future__ import annotations

import httpx
import pytest

from tests.unit.engine_shapes import (
    FAST_RETRY,
    SGLANG_METRICS,
    SHORT_TIMEOUTS,
    Script,
    box,
    run,
    sglang_generate,
)
from warmer.adapters.engines.base import EngineRejected
from warmer.adapters.engines.sglang import SglangEngine
from warmer.core.errors import CacheFieldMissing, EngineUnavailable, MalformedResponse, NotSupported
from warmer.core.model import EngineKind, ModelProfile, Prefix
from warmer.service.warming import WarmExecutor

BOX = box(EngineKind.SGLANG)
PREFIX = Prefix(text="You are a helpful voice agent. " * 20, token_count=140)


class StepClock:
    """Fake clock: each monotonic() read advances 10 ms; sleep advances by the amount."""

    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        self.t += 0.01
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


def engine(script: Script) -> SglangEngine:
    return SglangEngine(script.client(), timeouts=SHORT_TIMEOUTS, retry=FAST_RETRY)


def test_generate_reports_prompt_and_cached_tokens_and_sends_greedy_one_token() -> None:
    script = Script().on("POST", "/generate", sglang_generate(150, 128))
    report = run(engine(script).complete_prefix(BOX, PREFIX, suffix=" tail"))
    assert (report.prompt_tokens, report.cached_tokens) == (150, 128)
    assert report.engine_seconds == pytest.approx(0.0123)
    [sent] = script.bodies("/generate")
    assert sent["text"] == PREFIX.text + " tail"
    assert sent["sampling_params"] == {"max_new_tokens": 1, "temperature": 0.0}
    assert str(script.calls[0].url).startswith("http://engine.test:8000/generate")


def test_missing_cached_tokens_is_cache_field_missing_not_zero() -> None:
    body = sglang_generate(150, 0)
    del body["meta_info"]["cached_tokens"]
    script = Script().on("POST", "/generate", body)
    with pytest.raises(CacheFieldMissing, match=r"meta_info\.cached_tokens"):
        run(engine(script).complete_prefix(BOX, PREFIX))


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"<html>502 Bad Gateway</html>", "not JSON"),
        (b'["a", "list"]', "expected an object"),
        (b'{"text": "x", "meta_info": {"prompt_tokens": "many", "cached_tokens": 1}}', "not a number"),
        (b'{"text": "x", "meta_info": {"prompt_tokens": 10, "cached_tokens": -3}}', "negative"),
        (b'{"text": "x", "meta_info": {"prompt_tokens": 10, "cached_tokens": 11}}', "cached tokens of only"),
        (b'{"text": "x", "meta_info": {"prompt_tokens": 10.5, "cached_tokens": 1}}', "whole count"),
        (b'{"text": "x", "meta_info": {"prompt_tokens": 10, "cached_', "not JSON"),  # truncated
    ],
)
def test_garbage_bodies_are_malformed_responses(content: bytes, match: str) -> None:
    script = Script().on("POST", "/generate", httpx.Response(200, content=content))
    with pytest.raises(MalformedResponse, match=match):
        run(engine(script).complete_prefix(BOX, PREFIX))
    assert script.count("/generate") == 1  # a bad body is not retried


def test_5xx_then_success_is_retried() -> None:
    script = Script().on(
        "POST",
        "/generate",
        httpx.Response(503, text="server is starting"),
        httpx.Response(500, text="oops"),
        httpx.Response(200, json=sglang_generate(150, 140)),
    )
    report = run(engine(script).complete_prefix(BOX, PREFIX))
    assert report.cached_tokens == 140
    assert script.count("/generate") == 3


def test_persistent_5xx_gives_engine_unavailable_after_the_policy_attempts() -> None:
    script = Script().on("POST", "/generate", httpx.Response(503, text="starting"))
    with pytest.raises(EngineUnavailable, match="HTTP 503"):
        run(engine(script).complete_prefix(BOX, PREFIX))
    assert script.count("/generate") == FAST_RETRY.attempts


def test_timeouts_and_connect_errors_are_retried_then_unavailable() -> None:
    script = Script().on(
        "POST",
        "/generate",
        httpx.ReadTimeout("slow"),
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("slow"),
    )
    with pytest.raises(EngineUnavailable, match="timed out"):
        run(engine(script).complete_prefix(BOX, PREFIX))
    assert script.count("/generate") == 3


def test_4xx_is_not_retried() -> None:
    script = Script().on("POST", "/generate", httpx.Response(400, json={"error": "bad sampling params"}))
    with pytest.raises(EngineRejected, match="HTTP 400") as caught:
        run(engine(script).complete_prefix(BOX, PREFIX))
    assert caught.value.status == 400
    assert not caught.value.transient
    assert script.count("/generate") == 1


def test_health_is_200_only_and_503_while_starting_is_down() -> None:
    script = Script().on("GET", "/health", httpx.Response(503), httpx.Response(200))
    eng = engine(script)
    assert run(eng.health(BOX)) is False
    assert run(eng.health(BOX)) is True


def test_epoch_from_server_info_changes_with_launch_seed_and_after_health_bounce() -> None:
    info = {"model_path": "qwen", "random_seed": 625144628, "version": "0.5.0", "port": 30000}
    script = Script().on("GET", "/metrics", httpx.Response(404)).on("GET", "/get_server_info", info)
    eng = engine(script)
    first = run(eng.epoch(BOX))
    assert run(eng.epoch(BOX)) == first  # same process, same epoch
    script.on("GET", "/get_server_info", {**info, "random_seed": 7})  # a relaunch draws a new seed
    second = run(eng.epoch(BOX))
    assert second != first
    script.on("GET", "/health", httpx.Response(503), httpx.Response(200))
    run(eng.health(BOX))
    run(eng.health(BOX))
    assert run(eng.epoch(BOX)) != second


def test_epoch_prefers_process_start_time() -> None:
    script = Script().on(
        "GET", "/metrics", httpx.Response(200, text="process_start_time_seconds 1764470000.5\n")
    )
    assert run(engine(script).epoch(BOX)) == "sglang-start-1764470000.5"


def test_cache_stats_from_metrics() -> None:
    script = Script().on("GET", "/metrics", httpx.Response(200, text=SGLANG_METRICS))
    stats = run(engine(script).cache_stats(BOX))
    assert (stats.queried_tokens, stats.hit_tokens, stats.hit_rate) == (4096.0, 3168.0, 0.77)


def test_tokenize_and_render_are_not_supported() -> None:
    eng = engine(Script())
    with pytest.raises(NotSupported):
        run(eng.tokenize(BOX, "hi"))
    with pytest.raises(NotSupported):
        run(eng.render_chat(BOX, [{"role": "user", "content": "hi"}], []))


def test_hybrid_model_repeats_until_the_probe_hits() -> None:
    """A running-state model: round 1 the probe sees only a partial hit, round 2 the whole prefix."""
    probes_seen = 0

    def answer(request: httpx.Request) -> httpx.Response:
        nonlocal probes_seen
        import json

        text = json.loads(request.content)["text"]
        if "#probe" in text:
            probes_seen += 1
            cached = 64 if probes_seen == 1 else 140
            return httpx.Response(200, json=sglang_generate(150, cached))
        return httpx.Response(200, json=sglang_generate(150, 0))

    script = Script().on("POST", "/generate", answer)
    profile = ModelProfile(name="m", engine=EngineKind.SGLANG, running_state=True, warm_requests_per_prefix=2)
    outcome = run(WarmExecutor(engine(script), StepClock()).warm_and_verify(BOX, profile, PREFIX))
    assert outcome.verified
    assert outcome.rounds == 2
    assert outcome.requests_sent == 6  # 2 warm + 1 probe, twice
    warm_texts = [b["text"] for b in script.bodies("/generate") if "#warm" in b["text"]]
    assert len(set(warm_texts)) == 4
    assert all(t.startswith(PREFIX.text) for t in warm_texts)
    assert outcome.cached_tokens == 140
    assert outcome.engine_seconds == pytest.approx(6 * 0.0123)


def test_hybrid_model_that_never_hits_fails_with_why_after_bounded_rounds() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=sglang_generate(150, 16))

    script = Script().on("POST", "/generate", answer)
    profile = ModelProfile(name="m", engine=EngineKind.SGLANG, running_state=True, warm_requests_per_prefix=2)
    executor = WarmExecutor(engine(script), StepClock(), max_rounds_running_state=3)
    outcome = run(executor.warm_and_verify(BOX, profile, PREFIX))
    assert not outcome.verified
    assert outcome.rounds == 3
    assert outcome.requests_sent == 9
    assert outcome.reason is not None
    assert "16 cached of 140" in outcome.reason
    assert "3 round" in outcome.reason


def test_missing_cache_field_fails_the_warm_never_verifies_it() -> None:
    body = sglang_generate(150, 150)
    del body["meta_info"]["cached_tokens"]
    script = Script().on("POST", "/generate", body)
    profile = ModelProfile(name="m", engine=EngineKind.SGLANG)
    outcome = run(WarmExecutor(engine(script), StepClock()).warm_and_verify(BOX, profile, PREFIX))
    assert not outcome.verified
    assert outcome.reason is not None
    assert "cached_tokens" in outcome.reason
