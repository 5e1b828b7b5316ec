"""vLLM OpenAI-compatible server adapter.

Sources (vllm-project/vllm):
- `/v1/completions` takes `prompt` as text or a list of token ids, `max_tokens`, `temperature`; `usage`
  carries `prompt_tokens_details.cached_tokens` only when the server runs with
  `--enable-prompt-tokens-details` (vllm/entrypoints/openai/cli_args.py; issue #16162 for V1).
  On CPU the cache block is 128 tokens, so `cached_tokens` is a multiple of 128 (measured).
- `/tokenize`: `TokenizeCompletionRequest {prompt, add_special_tokens=True}` or
  `TokenizeChatRequest {messages, tools, add_generation_prompt=True, add_special_tokens=False}` ->
  `{tokens, count, max_model_len}`; `/detokenize {tokens}` -> `{prompt}`
  (vllm/entrypoints/openai/protocol.py).
- `/health` 200 when the engine is up; `/metrics`: `vllm:prefix_cache_queries_total`,
  `vllm:prefix_cache_hits_total` (tokens; docs/design/metrics.md "prefix_cache_hits ... in terms of number
  of cached tokens") and `process_start_time_seconds` from the Prometheus process collector (the epoch).
- `vllm:cache_config_info`: an info gauge whose labels are the CacheConfig fields, `block_size` among them
  (vllm/v1/metrics/loggers.py @ 005a810bc40faa25b8870fbc8559c3462581eee3, `log_engine_initialized` ->
  `log_metrics_info("cache_config", ...)`). The block size is what a hit is counted in, and it varies by
  backend and hybrid model (hybrid models get a block large enough for their state page), so warm
  verification takes it from here.
- Capacity: the same gauge's `num_gpu_blocks` label (CacheConfig's block count, set once the engine has
  sized its cache; `--num-gpu-blocks-override` pins it) x `block_size` is the KV pool in tokens. The share
  live requests hold is `vllm:kv_cache_usage_perc` (vllm/v1/metrics/loggers.py
  @ a6f0308cfe806b7731ad4979c9bea6e470c35efd, one series per engine: with data parallelism each rank is an
  engine with a pool of its own, so the figures are per rank and the busiest rank's share is taken), fed from
  the scheduler's stats by `BlockPool.get_usage` (vllm/v1/core/block_pool.py
  @ c59cb7941357443da7c5eef75cfa8697d683d228): `1 - free / (num_gpu_blocks - 1)`, where a freed block whose
  hash is kept for prefix hits goes back on the free queue (`free_blocks`: `ref_cnt == 0` cached blocks are
  appended to `free_block_queue`). Cached blocks no request holds count as free: the gauge is the running
  requests' working set.
- Data parallelism (`--data-parallel-size N` behind one API server): each rank is an engine with a KV cache
  of its own, and every `vllm:` series carries the rank in its `engine` label (the loggers above), so the
  ranks are the distinct `engine` values and the pool read from `vllm:cache_config_info` is one rank's
  (the smallest, should they differ): every rank must hold every prefix of the box. A request picks its
  rank with the `X-data-parallel-rank` header (vllm/entrypoints/openai/serving_engine.py
  @ 7ded96b3c73f63400cdb048a73c34292ba862d99, `_get_data_parallel_rank`), so each rank is warmed and probed
  by name. Each rank publishes its KV cache events on the configured port + its rank
  (vllm/distributed/kv_events.py, `ZmqEventPublisher.offset_endpoint_port`).
"""

from __future__ import annotations

from collections.abc import Sequence

from warmer.adapters.engines.base import (
    busiest_share,
    pool_capacity,
    process_start_time,
    string_field,
    token_list,
    unsupported_when_rejected,
)
from warmer.adapters.engines.http import JsonObject
from warmer.adapters.engines.openai import OpenAICompatibleEngine
from warmer.core.model import BoxCapacity, BoxSpec, CacheLayout, CompletionReport, EngineKind, Prefix
from warmer.core.promtext import Sample

DP_RANK_HEADER = "X-data-parallel-rank"


def data_parallel_ranks(samples: Sequence[Sample]) -> int:
    """How many engines (data-parallel ranks) the server's `vllm:` series name in their `engine` label."""
    engines = {s.label("engine") for s in samples if s.name.startswith("vllm:")}
    engines.discard(None)
    return max(1, len(engines))


def layout_from_metrics(samples: Sequence[Sample]) -> CacheLayout:
    """`block_size` of `vllm:cache_config_info` (None when the gauge or the label is absent or odd) and the
    number of data-parallel ranks."""
    ranks = data_parallel_ranks(samples)
    for sample in samples:
        if sample.name == "vllm:cache_config_info":
            value = sample.label("block_size")
            if value is not None and value.isdigit() and int(value) >= 1:
                return CacheLayout(
                    page_tokens=int(value),
                    source="vllm /metrics vllm:cache_config_info",
                    data_parallel_ranks=ranks,
                )
    return CacheLayout(source="vllm /metrics (no cache_config_info block_size)", data_parallel_ranks=ranks)


def capacity_from_metrics(samples: Sequence[Sample]) -> BoxCapacity:
    """Pool = `num_gpu_blocks` x `block_size` of `vllm:cache_config_info`; used share =
    `vllm:kv_cache_usage_perc` (see the module docstring). No pool when either label is absent or odd."""
    source = "vllm /metrics vllm:cache_config_info num_gpu_blocks x block_size, vllm:kv_cache_usage_perc"
    missing = BoxCapacity(source="vllm /metrics without cache_config_info num_gpu_blocks and block_size")
    pools: list[int] = []
    for sample in samples:
        if sample.name == "vllm:cache_config_info":
            blocks, size = sample.label("num_gpu_blocks"), sample.label("block_size")
            if blocks is None or size is None or not blocks.isdigit() or not size.isdigit():
                return missing
            pools.append(int(blocks) * int(size))
    if not pools or min(pools) < 1:
        return missing
    ranks = data_parallel_ranks(samples)
    if ranks > 1:
        source = f"{source} (per rank, {ranks} data-parallel ranks)"
    return pool_capacity(min(pools), busiest_share(samples, "vllm:kv_cache_usage_perc"), source)


class VllmEngine(OpenAICompatibleEngine):
    """EnginePort for vLLM: token-id prompts, engine-side tokenizing, process start time as the epoch."""

    cache_hint = "start vLLM with --enable-prompt-tokens-details"
    kind = "vllm"
    engine_kind = EngineKind.VLLM

    async def _process_start(self, box: BoxSpec) -> float | None:
        """The epoch read also refreshes the box's cache layout from the same /metrics body."""
        samples = await self._metrics_if_exposed(box)
        if samples is None:
            return None
        self._layouts[box.id] = layout_from_metrics(samples)
        return process_start_time(samples)

    async def cache_layout(self, box: BoxSpec) -> CacheLayout:
        layout = self._layouts.get(box.id)
        if layout is None:
            samples = await self._metrics_if_exposed(box)
            layout = CacheLayout() if samples is None else layout_from_metrics(samples)
            self._layouts[box.id] = layout
        return layout

    async def capacity(self, box: BoxSpec) -> BoxCapacity:
        """From one fresh /metrics read (the usage gauge moves with load), which also refreshes the layout."""
        samples = await self._metrics_if_exposed(box)
        if samples is None:
            return BoxCapacity(source="vllm /metrics is off")
        self._layouts[box.id] = layout_from_metrics(samples)
        return capacity_from_metrics(samples)

    async def _complete_greedy(
        self, box: BoxSpec, prompt: str | list[int], *, max_tokens: int, rank: int | None
    ) -> CompletionReport:
        """With `rank`, the request names its data-parallel rank (`X-data-parallel-rank`), so the warm and
        its probe meet the same rank's cache."""
        headers = None if rank is None else {DP_RANK_HEADER: str(rank)}
        return await self._complete(box, prompt, max_tokens=max_tokens, temperature=0.0, headers=headers)

    def _request_extras(self, box: BoxSpec) -> JsonObject:
        """On a box whose KV cache events are followed, warmer's own requests ask for "full" reports:
        a request that reuses cached blocks then announces them as `BlockStored` too
        (`vllm/v1/core/kv_cache_manager.py`: `kv_cache_report_mode` from the request's `vllm_xargs`;
        `block_pool.py` `emit_cached_block_events`), so a warm or probe that hits tells which blocks hold
        its prefix even when warmer missed their first store (it started later, or lost the stream)."""
        return {} if box.kv_events is None else {"vllm_xargs": {"kv_cache_report_mode": "full"}}

    async def _prompt_for(self, box: BoxSpec, prefix: Prefix, suffix: str) -> str | list[int]:
        if prefix.token_ids is None:
            return prefix.text + suffix
        # Ids keep the cached run ending exactly at the prefix boundary; the suffix is tokenized by the
        # engine without special tokens so nothing (e.g. a second BOS) is inserted between the two.
        suffix_ids = await self._tokenize(box, suffix, add_special_tokens=False) if suffix else []
        return [*prefix.token_ids, *suffix_ids]

    async def _tokenize(self, box: BoxSpec, text: str, *, add_special_tokens: bool) -> list[int]:
        return await self._post_tokenize(box, {"prompt": text, "add_special_tokens": add_special_tokens})

    async def _post_tokenize(self, box: BoxSpec, body: JsonObject) -> list[int]:
        """POST /tokenize (either request form) for the box's model; the `tokens` it answers, checked."""
        await self._add_model(box, body)
        response, _ = await self._http.post_json(box, "/tokenize", body)
        return token_list(box, "/tokenize", response.get("tokens"))

    async def tokenize(self, box: BoxSpec, text: str) -> list[int]:
        # add_special_tokens=True is what /v1/completions does with a text prompt.
        return await self._tokenize(box, text, add_special_tokens=True)

    async def tokenize_chat(
        self,
        box: BoxSpec,
        messages: Sequence[dict[str, object]],
        tools: Sequence[dict[str, object]],
        *,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """The token ids vLLM's chat endpoint would build from these messages and tools."""
        body: JsonObject = {
            "messages": list(messages),
            "add_generation_prompt": add_generation_prompt,
        }
        if tools:
            body["tools"] = list(tools)
        return await self._post_tokenize(box, body)

    async def render_chat(
        self, box: BoxSpec, messages: Sequence[dict[str, object]], tools: Sequence[dict[str, object]]
    ) -> str:
        ids = await self.tokenize_chat(box, messages, tools)
        body: JsonObject = {"tokens": ids}
        await self._add_model(box, body)
        with unsupported_when_rejected(box, "this vLLM has no /detokenize", statuses=(404, 405)):
            response, _ = await self._http.post_json(box, "/detokenize", body)
        return string_field(box, "/detokenize", response, "prompt")
