"""Engine response bodies as the engines document them, for contract tests over httpx.MockTransport.

Each builder cites where its shape comes from; only the numbers are parameters.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from warmer.core.model import BoxSpec, EngineKind, EngineTimeouts, RetryPolicy

T = TypeVar("T")

FAST_RETRY = RetryPolicy(attempts=3, initial_backoff_seconds=0.0, max_backoff_seconds=0.0, jitter_seconds=0.0)
SHORT_TIMEOUTS = EngineTimeouts(connect=0.5, health=0.5, request=0.5, long_request=0.5)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def box(engine: EngineKind, *, box_id: str = "b1", base_url: str = "http://engine.test:8000") -> BoxSpec:
    return BoxSpec(id=box_id, base_url=base_url, engine=engine, model="m")


# sgl-project/sglang python/sglang/srt/managers/tokenizer_manager.py (`_handle_batch_output`): /generate
# returns {"text", "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens",
# "cached_tokens", ...}}; docs/basic_usage/native_api.md shows the same object. e2e_latency is set by
# the tokenizer manager when the request finishes.
def sglang_generate(prompt_tokens: int, cached_tokens: int, *, text: str = "!") -> dict[str, Any]:
    return {
        "text": text,
        "meta_info": {
            "id": "0c4bd9f5b2a34f0e",
            "finish_reason": {"type": "length", "length": 1},
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 1,
            "cached_tokens": cached_tokens,
            "e2e_latency": 0.0123,
        },
    }


# OpenAI API reference, completion object (https://platform.openai.com/docs/api-reference/completions/object)
# with `usage.prompt_tokens_details.cached_tokens`; vLLM (`--enable-prompt-tokens-details`), SGLang
# (`--enable-cache-report`) and llama-server (tools/server/README.md "Timings and context usage") fill it.
def openai_completion(
    prompt_tokens: int, cached_tokens: int | None, *, details: bool = True
) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 1,
        "total_tokens": prompt_tokens + 1,
    }
    if details:
        usage["prompt_tokens_details"] = None if cached_tokens is None else {"cached_tokens": cached_tokens}
    return {
        "id": "cmpl-5f0e",
        "object": "text_completion",
        "created": 1764470000,
        "model": "m",
        "choices": [{"index": 0, "text": "!", "logprobs": None, "finish_reason": "length"}],
        "usage": usage,
    }


# ggml-org/llama.cpp tools/server/README.md, POST /completion response and "Timings and context usage":
# `timings.cache_n` = prompt tokens reused from cache, `timings.prompt_n` = prompt tokens processed;
# `tokens_cached` is what the slot holds afterwards.
def llamacpp_completion(cache_n: int, prompt_n: int, *, tokens_cached: int | None = None) -> dict[str, Any]:
    return {
        "content": "!",
        "id_slot": 0,
        "stop": True,
        "model": "tiny.gguf",
        "tokens_predicted": 1,
        "tokens_evaluated": cache_n + prompt_n,
        "tokens_cached": cache_n + prompt_n + 1 if tokens_cached is None else tokens_cached,
        "stop_type": "limit",
        "stopping_word": "",
        "truncated": False,
        "timings": {
            "cache_n": cache_n,
            "prompt_n": prompt_n,
            "prompt_ms": 12.5,
            "prompt_per_token_ms": 12.5 / max(1, prompt_n),
            "prompt_per_second": 80.0,
            "predicted_n": 1,
            "predicted_ms": 2.5,
            "predicted_per_token_ms": 2.5,
            "predicted_per_second": 400.0,
        },
    }


# llama.cpp tools/server/README.md, "GET /metrics" table (prompt_tokens_cached_total added by the metrics
# refactor; its HELP text there: "Total prompt processing tokens (excluding cached tokens)" for
# prompt_tokens_total).
LLAMACPP_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 300
# HELP llamacpp:prompt_tokens_cached_total Total prompt processing tokens (cached tokens).
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 900
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 42
"""

# vLLM docs/design/metrics.md: vllm:prefix_cache_queries / vllm:prefix_cache_hits (tokens), plus the
# Prometheus client's process collector (`process_start_time_seconds`).
VLLM_METRICS = """\
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.76447e+09
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 2048.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1536.0
"""

# sgl-project/sglang docs/references/production_metrics.md: sglang:prompt_tokens_total,
# sglang:cached_tokens_total (by cache_source), sglang:cache_hit_rate (gauge).
SGLANG_METRICS = """\
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 4096.0
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="m",cache_source="device"} 3000.0
sglang:cached_tokens_total{model_name="m",cache_source="host"} 168.0
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m"} 0.77
"""

Handler = Callable[[httpx.Request], httpx.Response]


@dataclass
class Script:
    """A scripted engine: per (method, path), a queue of responses (the last one repeats)."""

    routes: dict[tuple[str, str], list[Handler | httpx.Response | Exception]] = field(default_factory=dict)
    calls: list[httpx.Request] = field(default_factory=list)

    def on(
        self, method: str, path: str, *answers: Handler | httpx.Response | Exception | dict[str, Any]
    ) -> Script:
        converted: list[Handler | httpx.Response | Exception] = [
            httpx.Response(200, json=a) if isinstance(a, dict) else a for a in answers
        ]
        self.routes[(method, path)] = converted
        return self

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(request)
        queue = self.routes.get((request.method, request.url.path))
        if not queue:
            return httpx.Response(404, json={"detail": "Not Found"})
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, httpx.Response):
            return answer
        return answer(request)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handle))

    def bodies(self, path: str) -> list[dict[str, Any]]:
        return [json.loads(c.content) for c in self.calls if c.url.path == path and c.content]

    def count(self, path: str) -> int:
        return sum(1 for c in self.calls if c.url.path == path)


# sglang 0.5.23 (PyPI) sglang/srt/entrypoints/http_server.py `server_info` -> utils/common.py
# `build_server_info`: the resolved server args plus `version`, `startup_time` (per-phase launch durations)
# and `internal_states` (one per DP rank). Only the fields warmer reads are filled with meaning here.
def sglang_server_info(
    *,
    page_size: int = 1,
    strategy: str | None = None,
    strategy_key: str = "mamba_radix_cache_strategy",
    random_seed: int = 625144628,
    load_weight_seconds: float = 41.7,
) -> dict[str, Any]:
    info: dict[str, Any] = {
        "model_path": "Qwen/Qwen3-Next-80B-A3B-Instruct",
        "random_seed": random_seed,
        "page_size": page_size,
        "port": 30000,
        "dp_size": 1,
        "version": "0.5.23",
        "startup_time": {"load_weight": load_weight_seconds, "kv_cache_allocation": 3.2},
        "internal_states": [{"last_gen_throughput": 0.0}],
    }
    if strategy is not None:
        info[strategy_key] = strategy
    return info


class MambaRadixModel:
    """The hit rules of SGLang's hybrid (Mamba) radix cache, token = one character, for one box.

    Reproduces, for greedy single-token requests on a cold-to-warm tree (sglang 0.5.23 PyPI;
    sgl-project/sglang python/sglang/srt/mem_cache/mamba_radix_cache.py
    @ 00df707e8de4ab0110fb5527bf3c9dffc535671a):
    - a hit is the longest matched length at which a node holds a state (`_match_prefix_helper`:
      best_value_len advances only over nodes with a mamba_value), the match itself capped at len(prompt) - 1
      (`_compute_max_prefix_len`) and rounded down to whole pages (`RadixKey.match(..., page_size)`);
    - no_buffer: a finished request stores its state at its own end (`cache_finished_req` /
      unified_cache/components/mamba.py `prepare_for_caching_req`: cache_len = len(token_ids)); a split node
      gets none (`_split_node`);
    - extra_buffer: the state is tracked at prefix_len + (extend_len // grid) * grid, or at the chunk-aligned
      branching point when the match passed a node without state (managers/schedule_batch.py
      `_mamba_radix_cache_v2_req_prepare_for_extend`, mamba_radix_cache.py `_match_post_processor`); KV
      beyond the tracked point is freed (cache_len = mamba_last_track_seqlen).
    """

    def __init__(self, strategy: str, *, page_size: int = 1, chunk: int = 64) -> None:
        self.strategy, self.page, self.chunk = strategy, page_size, chunk
        self.grid = math.lcm(chunk, page_size)
        self.kv: list[str] = []  # sequences whose KV is in the tree
        self.states: set[str] = set()  # sequences at whose end a state is stored

    def _kv_match(self, prompt: str) -> int:
        limit = len(prompt) - 1
        best = 0
        for seq in self.kv:
            n = 0
            while n < min(len(seq), limit) and seq[n] == prompt[n]:
                n += 1
            best = max(best, n)
        return best // self.page * self.page

    def generate(self, prompt: str) -> int:
        """Run one request; return its cached tokens (what meta_info.cached_tokens reports)."""
        kv = self._kv_match(prompt)
        cached = max((n for n in range(kv, 0, -1) if prompt[:n] in self.states), default=0)
        if self.strategy == "no_buffer":
            self.states.add(prompt)
            self.kv.append(prompt)
            return cached
        extend = len(prompt) - cached
        tracked = cached + (extend // self.grid) * self.grid
        branching = kv // self.chunk * self.chunk if kv > cached else None
        if (
            branching is not None
            and cached < branching < len(prompt)
            and (branching - cached) % self.chunk == 0
        ):
            tracked = branching
        if tracked > cached:
            self.states.add(prompt[:tracked])
            self.kv.append(prompt[:tracked])
        return cached

    def handler(self) -> Callable[[httpx.Request], httpx.Response]:
        def answer(request: httpx.Request) -> httpx.Response:
            text = json.loads(request.content)["text"]
            return httpx.Response(200, json=sglang_generate(len(text), self.generate(text)))

        return answer


class DataParallelSglang:
    """An SGLang box started with --dp-size N: each rank has its own radix cache (dense, page 1).

    sglang 0.5.23 managers/data_parallel_controller.py: a request naming its rank (`routed_dp_rank`, or the
    deprecated `data_parallel_rank` that io_struct.py GenerateReqInput maps to it) goes to that rank;
    others are spread over the ranks by --load-balance-method (round robin here, one of its choices in
    arg_groups/fields/parallel.py; any spreading shows the same miss).
    """

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self.seen: list[list[str]] = [[] for _ in range(ranks)]
        self.next_rank = 0
        self.routed: list[int] = []

    def handler(self) -> Callable[[httpx.Request], httpx.Response]:
        def answer(request: httpx.Request) -> httpx.Response:
            body = json.loads(request.content)
            rank = body.get("data_parallel_rank")
            if rank is None:
                rank, self.next_rank = self.next_rank, (self.next_rank + 1) % self.ranks
            self.routed.append(rank)
            text = body["text"]
            limit = len(text) - 1
            cached = 0
            for seq in self.seen[rank]:
                n = 0
                while n < min(len(seq), limit) and seq[n] == text[n]:
                    n += 1
                cached = max(cached, n)
            self.seen[rank].append(text)
            return httpx.Response(200, json=sglang_generate(len(text), cached))

        return answer
