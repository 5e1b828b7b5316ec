"""SGLang adapter contract: documented /generate shapes in, typed reports or typed errors out."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.unit.engine_shapes import (
    FAST_RETRY,
    SGLANG_METRICS,
    SHORT_TIMEOUTS,
    DataParallelSglang,
    MambaRadixModel,
    Script,
    box,
    run,
    sglang_generate,
    sglang_server_info,
)
from warmer.adapters.engines.http import EngineRejected
from warmer.adapters.engines.sglang import SglangEngine, layout_from_server_info
from warmer.core.errors import (
    CacheFieldMissing,
    EngineDown,
    EngineUnavailable,
    HealthFailure,
    MalformedResponse,
    NotSupported,
)
from warmer.core.model import CacheTier, EngineKind, MambaStrategy, ModelProfile, Prefix
from warmer.service.engine_work.warming import WarmExecutor

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
    script = Script().on("GET", "/health", httpx.Response(503, text="loading"), httpx.Response(200))
    eng = engine(script)
    with pytest.raises(EngineDown, match="answered 503: loading") as caught:
        run(eng.health(BOX))
    assert caught.value.kind is HealthFailure.HTTP_STATUS
    assert run(eng.health(BOX)) is True


def test_epoch_without_startup_time_follows_the_seed_and_unreachable_bounces_not_503s() -> None:
    info = {"model_path": "qwen", "random_seed": 625144628, "version": "0.5.0", "port": 30000}
    script = Script().on("GET", "/server_info", info)
    eng = engine(script)
    first = run(eng.epoch(BOX))
    assert run(eng.epoch(BOX)) == first  # same process, same epoch
    script.on("GET", "/server_info", {**info, "random_seed": 7})  # a relaunch draws a new seed
    second = run(eng.epoch(BOX))
    assert second != first
    script.on("GET", "/health", httpx.Response(503), httpx.Response(200))  # a live process said 503
    with pytest.raises(EngineDown):
        run(eng.health(BOX))
    run(eng.health(BOX))
    assert run(eng.epoch(BOX)) == second
    script.on("GET", "/health", httpx.ConnectError("refused"), httpx.Response(200))  # gone, then back
    script.on("GET", "/model_info", httpx.ConnectError("refused"))
    with pytest.raises(EngineDown):
        run(eng.health(BOX))
    assert run(eng.health(BOX)) is True
    assert run(eng.epoch(BOX)) != second
    # Nothing in this info names the process: another warmer (adapter) instance cannot trust the epoch.
    assert run(engine(script).epoch(BOX)) != run(eng.epoch(BOX))


def test_epoch_with_startup_time_survives_a_warmer_restart_and_changes_with_the_process() -> None:
    script = Script().on("GET", "/server_info", sglang_server_info(load_weight_seconds=41.7))
    first = run(engine(script).epoch(BOX))
    assert run(engine(script).epoch(BOX)) == first  # a new adapter (a warmer restart): same process
    script.on("GET", "/server_info", sglang_server_info(load_weight_seconds=39.2))  # a new launch
    assert run(engine(script).epoch(BOX)) != first


def test_prompt_counter_going_backwards_is_a_new_epoch() -> None:
    metrics = '# TYPE sglang:prompt_tokens_total counter\nsglang:prompt_tokens_total{{model_name="m"}} {}\n'
    script = (
        Script()
        .on("GET", "/server_info", sglang_server_info())
        .on("GET", "/metrics", httpx.Response(200, text=metrics.format(5000.0)))
    )
    eng = engine(script)
    first = run(eng.epoch(BOX))
    script.on("GET", "/metrics", httpx.Response(200, text=metrics.format(6000.0)))
    assert run(eng.epoch(BOX)) == first
    script.on("GET", "/metrics", httpx.Response(200, text=metrics.format(12.0)))
    assert run(eng.epoch(BOX)) != first


def test_process_start_time_is_not_an_sglang_epoch() -> None:
    """SGLang's /metrics never carries process_start_time_seconds (multi-process registry); a line that
    looks like it does not decide the epoch, the server-info fingerprint does."""
    script = (
        Script()
        .on("GET", "/server_info", sglang_server_info())
        .on("GET", "/metrics", httpx.Response(200, text="process_start_time_seconds 1764470000.5\n"))
    )
    epoch = run(engine(script).epoch(BOX))
    assert not epoch.startswith("sglang-start")
    assert epoch == run(engine(script).epoch(BOX))


def test_slow_health_on_a_box_that_answers_is_up_and_keeps_the_epoch() -> None:
    """/health is a real generation (up to 20 s on a busy box): a timeout there while /model_info answers
    is slow, not down, and never a new epoch."""
    script = (
        Script()
        .on("GET", "/server_info", sglang_server_info())
        .on("GET", "/health", httpx.ReadTimeout("generating"), httpx.Response(200))
        .on("GET", "/model_info", {"model_path": "qwen", "is_generation": True})
    )
    eng = engine(script)
    before = run(eng.epoch(BOX))
    assert run(eng.health(BOX)) is True
    assert run(eng.health(BOX)) is True
    assert run(eng.epoch(BOX)) == before


def test_slow_server_info_on_a_box_that_answers_keeps_the_last_epoch() -> None:
    script = (
        Script()
        .on("GET", "/server_info", sglang_server_info(), httpx.ReadTimeout("busy"))
        .on("GET", "/model_info", {"model_path": "qwen", "is_generation": True})
    )
    eng = engine(script)
    first = run(eng.epoch(BOX))
    assert run(eng.epoch(BOX)) == first  # /server_info timed out on every attempt; the box answered
    script.on("GET", "/model_info", httpx.ConnectError("refused"))
    with pytest.raises(EngineUnavailable):
        run(eng.epoch(BOX))  # nothing answers: no epoch to vouch for


def test_health_timeout_on_a_box_that_does_not_answer_is_down() -> None:
    script = (
        Script()
        .on("GET", "/health", httpx.ReadTimeout("nothing"))
        .on("GET", "/model_info", httpx.ConnectTimeout("nothing"))
    )
    with pytest.raises(EngineDown, match="timed out") as caught:
        run(engine(script).health(BOX))
    assert caught.value.kind is HealthFailure.TIMEOUT


def test_cache_stats_from_metrics() -> None:
    script = Script().on("GET", "/metrics", httpx.Response(200, text=SGLANG_METRICS))
    stats = run(engine(script).cache_stats(BOX))
    assert (stats.queried_tokens, stats.hit_tokens) == (4096.0, 3168.0)  # the last-batch gauge is not read


def test_cache_stats_with_one_counter_missing_is_malformed() -> None:
    text = "# TYPE sglang:prompt_tokens_total counter\nsglang:prompt_tokens_total 10.0\n"
    script = Script().on("GET", "/metrics", httpx.Response(200, text=text))
    with pytest.raises(MalformedResponse, match="sglang:cached_tokens_total"):
        run(engine(script).cache_stats(BOX))


def test_cache_stats_metrics_off_is_not_supported() -> None:
    with pytest.raises(NotSupported, match="--enable-metrics"):
        run(engine(Script()).cache_stats(BOX))


def test_tokenize_and_render_are_not_supported() -> None:
    eng = engine(Script())
    with pytest.raises(NotSupported):
        run(eng.tokenize(BOX, "hi"))
    with pytest.raises(NotSupported):
        run(eng.render_chat(BOX, [{"role": "user", "content": "hi"}], []))


def hybrid(**kwargs: Any) -> ModelProfile:
    return ModelProfile(name="m", engine=EngineKind.SGLANG, running_state=True, **kwargs)


def test_server_info_is_asked_before_the_deprecated_route() -> None:
    script = (
        Script()
        .on("GET", "/server_info", sglang_server_info(page_size=16))
        .on("GET", "/get_server_info", sglang_server_info(page_size=1))
    )
    layout = run(engine(script).cache_layout(BOX))
    assert layout.page_tokens == 16
    assert script.count("/get_server_info") == 0


def test_deprecated_server_info_route_when_the_new_one_is_missing() -> None:
    script = Script().on("GET", "/get_server_info", sglang_server_info(page_size=32))
    assert run(engine(script).cache_layout(BOX)).page_tokens == 32
    assert script.count("/server_info") == 1  # asked first, answered 404


@pytest.mark.parametrize(
    ("strategy", "key", "expected"),
    [
        ("no_buffer", "mamba_radix_cache_strategy", MambaStrategy.NO_BUFFER),
        ("extra_buffer", "mamba_radix_cache_strategy", MambaStrategy.EXTRA_BUFFER),
        ("extra_buffer_lazy", "mamba_radix_cache_strategy", MambaStrategy.EXTRA_BUFFER),
        ("extra_buffer", "mamba_scheduler_strategy", MambaStrategy.EXTRA_BUFFER),  # the earlier name
        ("auto", "mamba_radix_cache_strategy", None),  # unresolved: not known
        (None, "mamba_radix_cache_strategy", None),
    ],
)
def test_layout_reads_the_mamba_strategy(
    strategy: str | None, key: str, expected: MambaStrategy | None
) -> None:
    info = sglang_server_info(strategy=strategy, strategy_key=key)
    assert layout_from_server_info(info).mamba_strategy is expected


def test_paged_dense_sglang_verifies_within_the_server_page() -> None:
    """page_size 64 (e.g. FlashMLA forces it): the probe sees the prefix rounded down to whole pages; the
    profile's block_tokens 1 is only a fallback."""
    script = (
        Script()
        .on("GET", "/server_info", sglang_server_info(page_size=64))
        .on("POST", "/generate", sglang_generate(620, 0), sglang_generate(640, 576))
    )
    dense = ModelProfile(name="m", engine=EngineKind.SGLANG, block_tokens=1)
    outcome = run(WarmExecutor(engine(script), StepClock()).warm_and_verify(BOX, dense, PREFIX))
    assert outcome.verified
    assert (outcome.prefix_tokens, outcome.cached_tokens, outcome.block_tokens) == (620, 576, 64)
    assert outcome.block_source == "sglang /server_info"


def test_layout_failure_falls_back_to_the_profile_block() -> None:
    script = (
        Script()
        .on("GET", "/server_info", httpx.Response(503))
        .on("POST", "/generate", sglang_generate(620, 0), sglang_generate(640, 576))
    )
    dense = ModelProfile(name="m", engine=EngineKind.SGLANG, block_tokens=1)
    outcome = run(WarmExecutor(engine(script), StepClock()).warm_and_verify(BOX, dense, PREFIX))
    assert not outcome.verified
    assert (outcome.block_tokens, outcome.block_source) == (1, "profile")


def test_suffix_warms_leave_no_usable_state_with_no_buffer() -> None:
    """Why warms are the bare prefix: 'prefix + different suffix' splits the tree just after the prefix and
    the split node holds no state, so a probe reads 0 cached every time (MambaRadixModel cites the code)."""
    model = MambaRadixModel("no_buffer")
    model.generate(PREFIX.text + "\n#warm 1.0 aa")
    model.generate(PREFIX.text + "\n#warm 1.1 bb")
    assert model.generate(PREFIX.text + "\n#probe cc") == 0


def test_hybrid_no_buffer_warms_the_bare_prefix_and_hits_the_whole_prefix() -> None:
    model = MambaRadixModel("no_buffer")
    script = (
        Script()
        .on("GET", "/server_info", sglang_server_info(strategy="no_buffer"))
        .on("POST", "/generate", model.handler())
    )
    outcome = run(WarmExecutor(engine(script), StepClock()).warm_and_verify(BOX, hybrid(), PREFIX))
    assert outcome.verified
    assert outcome.rounds == 1
    assert outcome.cached_tokens == len(PREFIX.text)
    sent = [b["text"] for b in script.bodies("/generate")]
    assert sent[0] == PREFIX.text  # the state is stored exactly at the prefix's end
    assert sent[1].startswith(PREFIX.text + "\n#probe")


@pytest.mark.parametrize(("page", "grid"), [(1, 64), (16, 64), (128, 128)])
def test_hybrid_extra_buffer_verifies_at_the_checkpoint_grid(page: int, grid: int) -> None:
    """extra_buffer: the hit is the prefix rounded down to lcm(max(model chunk 64, page), page); the
    verification tolerates exactly that, not the 'all but one token' a dense model gets."""
    model = MambaRadixModel("extra_buffer", page_size=page, chunk=max(64, page))
    script = (
        Script()
        .on("GET", "/server_info", sglang_server_info(page_size=page, strategy="extra_buffer"))
        .on("POST", "/generate", model.handler())
    )
    outcome = run(WarmExecutor(engine(script), StepClock()).warm_and_verify(BOX, hybrid(), PREFIX))
    n = len(PREFIX.text)
    assert outcome.cached_tokens == n // grid * grid
    assert outcome.block_tokens == grid
    assert outcome.verified


def test_hybrid_extra_buffer_uses_the_model_chunk_from_the_profile() -> None:
    """A model whose HF config says mamba_chunk_size 256: SGLang checkpoints every 256 tokens."""
    model = MambaRadixModel("extra_buffer", chunk=256)
    script = (
        Script()
        .on("GET", "/server_info", sglang_server_info(strategy="extra_buffer"))
        .on("POST", "/generate", model.handler())
    )
    outcome = run(
        WarmExecutor(engine(script), StepClock()).warm_and_verify(BOX, hybrid(mamba_chunk_size=256), PREFIX)
    )
    assert (outcome.cached_tokens, outcome.block_tokens) == (512, 256)
    assert outcome.verified


def test_hybrid_model_that_never_hits_fails_with_why_after_bounded_rounds() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=sglang_generate(150, 16))

    script = Script().on("GET", "/server_info", sglang_server_info()).on("POST", "/generate", answer)
    executor = WarmExecutor(engine(script), StepClock(), max_rounds_running_state=3)
    outcome = run(executor.warm_and_verify(BOX, hybrid(), PREFIX))
    assert not outcome.verified
    assert outcome.rounds == 3
    assert outcome.requests_sent == 6  # a bare-prefix warm and a probe per round
    assert outcome.reason is not None
    assert "16 cached of 150" in outcome.reason
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


def test_dp_ranks_are_each_warmed_and_probed_by_rank() -> None:
    """--dp-size 2: without a rank the probe may land on the other rank's (cold) cache; naming the rank
    makes warm and probe meet, and the prefix is verified only when every rank holds it."""
    server = DataParallelSglang(ranks=2)
    info = {**sglang_server_info(), "dp_size": 2}
    script = Script().on("GET", "/server_info", info).on("POST", "/generate", server.handler())
    dense = ModelProfile(name="m", engine=EngineKind.SGLANG)
    outcome = run(WarmExecutor(engine(script), StepClock()).warm_and_verify(BOX, dense, PREFIX))
    assert outcome.verified, outcome.reason
    assert outcome.ranks == 2
    assert server.routed == [0, 0, 1, 1]  # warm + probe on rank 0, then on rank 1
    assert all(len(seen) == 2 for seen in server.seen)
    assert "on each of 2 DP ranks" in outcome.describe()


def test_dp_rank_probe_miss_names_the_rank() -> None:
    server = DataParallelSglang(ranks=2)
    info = {**sglang_server_info(), "dp_size": 2}
    script = Script().on("GET", "/server_info", info).on("POST", "/generate", server.handler())
    server.seen[0].append(PREFIX.text)  # only rank 0 holds the prefix
    dense = ModelProfile(name="m", engine=EngineKind.SGLANG)
    outcome = run(WarmExecutor(engine(script), StepClock()).probe(BOX, dense, PREFIX))
    assert not outcome.verified
    assert outcome.reason is not None
    assert outcome.reason.startswith("DP rank 1: probe saw 0 cached")


def test_other_engines_refuse_a_rank() -> None:
    from warmer.adapters.engines.llamacpp import LlamaCppEngine

    llama = LlamaCppEngine(Script().client())
    with pytest.raises(NotSupported, match="data-parallel rank"):
        run(llama.complete_prefix(box(EngineKind.LLAMACPP), PREFIX, rank=1))


def hicache_generate(device: int, host: int, *, prompt_tokens: int = 150) -> dict[str, Any]:
    """A /generate answer with HiCache on: `meta_info.cached_tokens` is device + host and
    `cached_tokens_details` splits it (sglang managers/scheduler_output_processor_mixin.py
    `_get_cached_tokens_details`: {"device": X, "host": Y} when HiCache is enabled, no L3 storage)."""
    body = sglang_generate(prompt_tokens, device + host)
    body["meta_info"]["cached_tokens_details"] = {"device": device, "host": host}
    return body


@pytest.mark.parametrize(("tier", "cached"), [(CacheTier.DEVICE, 16), (CacheTier.HOST, 144)])
def test_a_hicache_host_hit_is_not_a_gpu_hit_unless_the_box_says_so(tier: CacheTier, cached: int) -> None:
    from dataclasses import replace

    script = Script().on("POST", "/generate", hicache_generate(16, 128))
    report = run(engine(script).complete_prefix(replace(BOX, warm_tier=tier), PREFIX))
    assert report.cached_tokens == cached


def test_an_answer_from_another_dp_rank_is_an_error_not_a_hit() -> None:
    """sglang tokenizer_manager.py: `meta_info["dp_rank"] = recv_obj.dp_ranks[i]`."""
    answered = sglang_generate(150, 140)
    answered["meta_info"]["dp_rank"] = 0
    script = Script().on("POST", "/generate", answered)
    with pytest.raises(MalformedResponse, match="asked data-parallel rank 1, answered by rank 0"):
        run(engine(script).complete_prefix(BOX, PREFIX, rank=1))
    assert run(engine(script).complete_prefix(BOX, PREFIX, rank=0)).cached_tokens == 140


@pytest.mark.parametrize(("policy", "sent"), [("priority", 100), ("lru", None)])
def test_warm_requests_carry_the_boxs_priority_where_the_server_evicts_by_priority(
    policy: str, sent: int | None
) -> None:
    """`--radix-eviction-policy priority` (sglang mem_cache/evict_policy.py `PriorityStrategy`: lowest
    priority evicted first), read from /server_info `radix_eviction_policy`."""
    from dataclasses import replace

    info = {**sglang_server_info(), "radix_eviction_policy": policy}
    script = Script().on("GET", "/server_info", info).on("POST", "/generate", sglang_generate(150, 0))
    run(engine(script).complete_prefix(replace(BOX, warm_priority=100), PREFIX))
    run(engine(script).complete_prefix(BOX, PREFIX))  # no warm_priority: nothing sent
    first, second = script.bodies("/generate")
    assert first.get("priority") == sent
    assert "priority" not in second
