"""What the SGLang and vLLM adapters report as capacity: the KV pool in tokens and the share live requests
hold, from answers shaped as each engine's source writes them."""

from __future__ import annotations

from typing import Any

import httpx

from tests.unit.engine_shapes import (
    FAST_RETRY,
    SGLANG_METRICS,
    SHORT_TIMEOUTS,
    VLLM_METRICS,
    Script,
    box,
    run,
    sglang_server_info,
)
from warmer.adapters.engines.sglang import SglangEngine
from warmer.adapters.engines.vllm import VllmEngine
from warmer.core.capacity import prefix_budget_tokens
from warmer.core.model import EngineKind

SGLANG = box(EngineKind.SGLANG)
VLLM = box(EngineKind.VLLM)


# sglang http_server.py @ 0025436eab0556737d615b36a4dd3e1e26e82f3d `get_server_info`: the server args, then
# `**_global_state.scheduler_info` (managers/scheduler.py `get_init_info`: status, max_total_num_tokens,
# max_req_input_len), `internal_states` and `version`.
def server_info_with_pool(pool: int) -> dict[str, Any]:
    return {
        **sglang_server_info(),
        "status": "ready",
        "max_total_num_tokens": pool,
        "max_req_input_len": pool - 1,
    }


# sglang metrics/collector.py `SchedulerMetricsCollector`: the `sglang:token_usage` gauge, labelled per
# scheduler (model_name, engine_type, tp_rank, pp_rank, and dp_rank with data parallelism), its value
# `round(num_used / max_total_num_tokens, 2)` (managers/scheduler_runtime_checker_mixin.py @ 008e7b87
# `update_scheduler_stats`).
def sglang_metrics(*usage: float) -> str:
    lines = [SGLANG_METRICS, "# HELP sglang:token_usage The token usage.", "# TYPE sglang:token_usage gauge"]
    for rank, share in enumerate(usage):
        lines.append(
            f'sglang:token_usage{{dp_rank="{rank}",engine_type="unified",model_name="m",pp_rank="0",'
            f'tp_rank="0"}} {share}'
        )
    return "\n".join(lines) + "\n"


def sglang(script: Script) -> SglangEngine:
    return SglangEngine(script.client(), timeouts=SHORT_TIMEOUTS, retry=FAST_RETRY)


def test_sglang_pool_is_max_total_num_tokens_and_used_is_the_token_usage_gauge() -> None:
    script = (
        Script()
        .on("GET", "/server_info", server_info_with_pool(500_000))
        .on("GET", "/metrics", httpx.Response(200, text=sglang_metrics(0.31)))
    )
    capacity = run(sglang(script).capacity(SGLANG))
    assert (capacity.pool_tokens, capacity.used_share) == (500_000, 0.31)
    assert capacity.tokens == prefix_budget_tokens(500_000, 0.31)
    assert "max_total_num_tokens" in capacity.source
    assert capacity.version == server_info_with_pool(1)["version"], "/server_info names the release"


def test_sglang_capacity_reuses_the_server_info_the_epoch_poll_read_and_reads_the_gauge_fresh() -> None:
    script = (
        Script()
        .on("GET", "/server_info", server_info_with_pool(200_000))
        .on(
            "GET",
            "/metrics",
            httpx.Response(200, text=sglang_metrics(0.1)),
            httpx.Response(200, text=sglang_metrics(0.1)),
            httpx.Response(200, text=sglang_metrics(0.6)),
        )
    )
    engine = sglang(script)
    run(engine.epoch(SGLANG))  # reads /server_info and /metrics, as every health poll does
    idle = run(engine.capacity(SGLANG))
    busy = run(engine.capacity(SGLANG))
    assert script.count("/server_info") == 1
    assert (idle.used_share, busy.used_share) == (0.1, 0.6)
    assert (busy.tokens, idle.tokens) == (
        prefix_budget_tokens(200_000, 0.6),
        prefix_budget_tokens(200_000, 0.1),
    )


def test_sglang_data_parallel_ranks_report_the_busiest_rank() -> None:
    info = {**server_info_with_pool(100_000), "dp_size": 2}
    script = (
        Script()
        .on("GET", "/server_info", info)
        .on("GET", "/metrics", httpx.Response(200, text=sglang_metrics(0.2, 0.45)))
    )
    assert run(sglang(script).capacity(SGLANG)).used_share == 0.45


def test_sglang_with_metrics_off_reports_the_pool_as_idle_and_says_so() -> None:
    script = (
        Script()
        .on("GET", "/server_info", server_info_with_pool(100_000))
        .on("GET", "/metrics", httpx.Response(404, json={"detail": "Not Found"}))
    )
    capacity = run(sglang(script).capacity(SGLANG))
    assert (capacity.pool_tokens, capacity.used_share) == (100_000, None)
    assert capacity.tokens == prefix_budget_tokens(100_000, None)
    assert "not reported" in capacity.source


def test_sglang_without_max_total_num_tokens_reports_no_pool() -> None:
    script = Script().on("GET", "/server_info", sglang_server_info())
    capacity = run(sglang(script).capacity(SGLANG))
    assert (capacity.tokens, capacity.pool_tokens) == (None, None)
    assert "without max_total_num_tokens" in capacity.source


# vllm/v1/metrics/loggers.py @ a6f0308cfe806b7731ad4979c9bea6e470c35efd: `vllm:cache_config_info` carries the
# CacheConfig fields as string labels (num_gpu_blocks among them), and `vllm:kv_cache_usage_perc` ("KV-cache
# usage. 1 means 100 percent usage.") is one series per engine (`engine`, `model_name` labels); its value is
# `BlockPool.get_usage` (vllm/v1/core/block_pool.py @ c59cb7941357443da7c5eef75cfa8697d683d228).
def vllm_metrics(*usage: float, blocks: str = "1200", block_size: str = "16") -> str:
    lines = [
        VLLM_METRICS.rstrip("\n"),
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="{block_size}",cache_dtype="auto",enable_prefix_caching="True",'
        f'engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="{blocks}",'
        'num_gpu_blocks_override="None"} 1.0',
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
    ]
    for engine, share in enumerate(usage):
        lines.append(f'vllm:kv_cache_usage_perc{{engine="{engine}",model_name="m"}} {share}')
    return "\n".join(lines) + "\n"


def vllm(script: Script) -> VllmEngine:
    return VllmEngine(script.client(), timeouts=SHORT_TIMEOUTS, retry=FAST_RETRY)


def test_vllm_pool_is_num_gpu_blocks_times_block_size_and_used_is_kv_cache_usage() -> None:
    script = Script().on("GET", "/metrics", httpx.Response(200, text=vllm_metrics(0.25)))
    engine = vllm(script)
    capacity = run(engine.capacity(VLLM))
    assert (capacity.pool_tokens, capacity.used_share) == (1200 * 16, 0.25)
    assert capacity.tokens == prefix_budget_tokens(1200 * 16, 0.25)
    assert run(engine.cache_layout(VLLM)).page_tokens == 16  # the same read refreshed the layout
    assert script.count("/metrics") == 1


def test_vllm_data_parallel_engines_report_the_busiest_one() -> None:
    script = Script().on("GET", "/metrics", httpx.Response(200, text=vllm_metrics(0.05, 0.7)))
    assert run(vllm(script).capacity(VLLM)).used_share == 0.7


def test_vllm_without_a_block_count_reports_no_pool() -> None:
    script = Script().on("GET", "/metrics", httpx.Response(200, text=vllm_metrics(0.1, blocks="None")))
    capacity = run(vllm(script).capacity(VLLM))
    assert (capacity.tokens, capacity.pool_tokens) == (None, None)
    plain = Script().on("GET", "/metrics", httpx.Response(200, text=VLLM_METRICS))
    assert run(vllm(plain).capacity(VLLM)).pool_tokens is None
