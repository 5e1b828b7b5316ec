"""Engine response bodies as the engines document them, for contract tests over httpx.MockTransport.

Each builder cites where its shape comes from; only the numbers are parameters.
"""

from __future__ import annotations

import asyncio
import json
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
