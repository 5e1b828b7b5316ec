"""SGLang runtime adapter (native API).

Sources (sgl-project/sglang):
- POST /generate: `text` (or `input_ids`) and `sampling_params` {`max_new_tokens`, `temperature`,
  `json_schema`} (docs/sampling_params.md, docs/basic_usage/native_api.md). The response is
  `{"text": ..., "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens",
  "cached_tokens", ...}}` (python/sglang/srt/managers/tokenizer_manager.py, `_handle_batch_output`:
  `meta_info.update({"completion_tokens": ..., "cached_tokens": recv_obj.cached_tokens[i]})`). Unlike
  `usage.prompt_tokens_details` on the OpenAI routes, `meta_info.cached_tokens` needs no server flag.
  Timings: `meta_info.e2e_latency` (seconds) when present.
- GET /health runs a real one-token generation (sglang 0.5.23 http_server.py `health_generate`, with
  SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION on by default) and waits up to SGLANG_HEALTH_CHECK_TIMEOUT
  (20 s) for the scheduler: 200 when it answered, 503 while starting, shutting down, or after that wait.
  On a busy box it is slow, not down: a /health timeout on a box whose `/model_info` (tokenizer-manager
  fields only, no scheduler round trip) still answers is "slow" and counts as up.
- GET /server_info (the deprecated /get_server_info only
  forwards to it: sglang 0.5.23 sglang/srt/entrypoints/http_server.py `get_server_info`): the resolved
  server args (`server_args.resolved_dict()`, sglang/srt/utils/common.py `build_server_info`), including
  `model_path`, `random_seed` (drawn at random per launch unless pinned), `page_size` and, for hybrid
  models, `mamba_radix_cache_strategy` (earlier releases: `mamba_scheduler_strategy`), plus `version`.
- Capacity: `/server_info` also carries the scheduler's init info, merged into the answer
  (http_server.py @ 0025436eab0556737d615b36a4dd3e1e26e82f3d `get_server_info`: `{**server_args,
  **_global_state.scheduler_info, "internal_states", "version"}`; the scheduler's handshake
  managers/scheduler.py `get_init_info` -> `{"status", "max_total_num_tokens", "max_req_input_len"}`, of the
  first rank: per rank with `--dp-size` > 1). `max_total_num_tokens` is the KV token pool. The share live
  requests hold is the `sglang:token_usage` gauge (metrics/collector.py `SchedulerMetricsCollector`, one
  series per tp/pp/dp rank, set on every prefill batch and decode log interval by
  managers/scheduler_metrics_mixin.py @ 01bb3c807f7e62c19a31de7548837505488c2b64): `num_used /
  max_total_num_tokens` with `num_used = max_total_num_tokens - (available_size + evictable_size)`
  (managers/scheduler_runtime_checker_mixin.py @ 008e7b87b07c4ef50f6506ffd1ae956fb9e16021 `_get_token_info`),
  so cached tokens no request holds (evictable) count as free; hybrid models report the fullest of their
  pools (`get_max_pool_usage`). The gauge keeps its last value until the next batch (a /health poll runs one
  when the box is idle).
- GET /metrics (with `--enable-metrics`): `sglang:prompt_tokens_total`, `sglang:cached_tokens_total`
  (labelled by `cache_source` in newer versions: summed) (docs/references/production_metrics.md). It has
  no `process_start_time_seconds` (SGLang serves a multi-process registry), so restarts are told by:
  - the /server_info fingerprint: `startup_time` (0.5.23: the launch's measured per-phase durations,
    http_server.py `set_startup_time`) and `random_seed` (drawn per launch unless pinned) change per
    process; with `startup_time` present the epoch is that fingerprint alone, so a warmer restart over a
    running SGLang keeps the epoch; without it nothing names the process and the epoch carries this
    adapter's nonce (a warmer restart re-verifies);
  - `sglang:prompt_tokens_total` going backwards (a counter only grows within one process);
  - the box being unreachable (no answer at all) and coming back. A 503 or a slow /health from a process
    that still answers is not a restart.

Which cached tokens are warm, which rank answered, and how a warm asks to stay (sgl-project/sglang):
- With HiCache (`--enable-hierarchical-cache`) `meta_info.cached_tokens_details` splits the hit into
  `{"device": N, "host": M}` (plus `storage`, `storage_backend` with an L3 tier); it is absent without
  HiCache or when nothing was cached (managers/scheduler_output_processor_mixin.py
  `_get_cached_tokens_details`, copied into `meta_info` by managers/tokenizer_manager.py
  `_handle_batch_output`). `meta_info.cached_tokens` is their sum, so a prefix moved to host memory reads
  as a full hit although its KV is copied back to the GPU before prefill. The box's `warm_tier` says what
  counts: "device" (default) takes `device` alone, "host" device + host.
- `meta_info.dp_rank` names the data-parallel rank that answered (tokenizer_manager.py:
  `meta_info["dp_rank"] = recv_obj.dp_ranks[i]`). A warm or probe aimed at a rank that another rank
  answered verified nothing about the rank asked for: it is an error, never a hit.
- `--radix-eviction-policy priority` evicts the lowest `priority` first, least recently used within one
  (mem_cache/evict_policy.py `PriorityStrategy.get_priority`: `(node.priority, node.last_access_time)`);
  /server_info publishes the policy (`radix_eviction_policy`). Where it is on and the box names a
  `warm_priority`, warm requests carry it (GenerateReqInput `priority`).
- KV cache events: SGLang publishes the same ZeroMQ stream as vLLM (`--kv-events-config`,
  disaggregation/kv_events.py @ 006d053f182f9b488d2bd841afa06d5f9120a258: array-encoded
  `[ts, events]`, `BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id)`, a
  replay socket, each DP rank on port + rank); `vllm_kv_events` reads both encodings.

Prompts are sent as text: SGLang tokenizes the same text the same way for the warm, the probe and the chat
requests it renders, and /generate cannot mix token ids with a text suffix.

Hybrid (Mamba-style) models keep a running state only at checkpointed points; the warm executor sends
several prefix+suffix requests and probes until the hit shows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

import httpx

from warmer.adapters.engines.base import (
    EngineAdapter,
    busiest_share,
    check_cached_within_prompt,
    count_field,
    fingerprint_digest,
    metric_sum,
    optional_seconds,
    pool_capacity,
    reject_error_body,
)
from warmer.adapters.engines.http import EngineRejected, JsonObject
from warmer.adapters.engines.restart_watch import RestartWatch
from warmer.core.errors import EngineUnavailable, MalformedResponse, NotSupported
from warmer.core.model import (
    BoxCapacity,
    BoxSpec,
    CacheLayout,
    CacheTier,
    CompletionReport,
    EngineKind,
    EngineTimeouts,
    MambaStrategy,
    Prefix,
    RetryPolicy,
)

GENERATE_PATH = "/generate"


def parse_generate(
    box: BoxSpec, body: JsonObject, wall_seconds: float, *, rank: int | None = None
) -> CompletionReport:
    """`meta_info.prompt_tokens` and the cached tokens of the box's `warm_tier`, checked; with `rank`, the
    answering `meta_info.dp_rank` must be it (see the module docstring)."""
    prompt_tokens = count_field(box, GENERATE_PATH, body, "meta_info.prompt_tokens")
    cached = count_field(
        box, GENERATE_PATH, body, "meta_info.cached_tokens", cache_field=True,
        hint="SGLang too old to report meta_info.cached_tokens",
    )  # fmt: skip
    details = body.get("meta_info", {}).get("cached_tokens_details")
    if isinstance(details, dict) and "device" in details:
        device = count_field(box, GENERATE_PATH, body, "meta_info.cached_tokens_details.device")
        host = count_field(box, GENERATE_PATH, body, "meta_info.cached_tokens_details.host")
        cached = device if box.warm_tier is CacheTier.DEVICE else device + host
    check_cached_within_prompt(box, GENERATE_PATH, prompt_tokens, cached)
    answered = body.get("meta_info", {}).get("dp_rank")
    if rank is not None and isinstance(answered, int) and not isinstance(answered, bool) and answered != rank:
        raise MalformedResponse(
            box.id, f"{GENERATE_PATH} asked data-parallel rank {rank}, answered by rank {answered}"
        )
    text = body.get("text")
    return CompletionReport(
        prompt_tokens=prompt_tokens,
        cached_tokens=cached,
        wall_seconds=wall_seconds,
        engine_seconds=optional_seconds(body, "meta_info.e2e_latency"),
        text=text if isinstance(text, str) else "",
    )


_STRATEGIES = {
    "no_buffer": MambaStrategy.NO_BUFFER,
    "extra_buffer": MambaStrategy.EXTRA_BUFFER,
    "extra_buffer_lazy": MambaStrategy.EXTRA_BUFFER,  # same checkpoint grid, second buffer allocated late
}


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def layout_from_server_info(info: JsonObject) -> CacheLayout:
    """Page size and Mamba strategy from a /server_info body; anything absent or odd stays None.

    `auto` is resolved by the server before it publishes the args (sglang 0.5.23 arg_groups/overrides.py:
    auto -> extra_buffer or no_buffer for hybrid models); an unresolved or unknown value means "not known".
    `mamba_cache_chunk_size` is not a server-arg field in 0.5.23 (a derived value, arg_groups/overrides.py),
    so it is read only when a build reports it; otherwise it is derived from the profile and the page.
    """
    strategy = info.get("mamba_radix_cache_strategy", info.get("mamba_scheduler_strategy"))
    return CacheLayout(
        page_tokens=_positive_int(info.get("page_size")),
        mamba_strategy=_STRATEGIES.get(strategy) if isinstance(strategy, str) else None,
        mamba_chunk_tokens=_positive_int(info.get("mamba_cache_chunk_size")),
        source="sglang /server_info",
        data_parallel_ranks=_positive_int(info.get("dp_size")) or 1,
    )


class SglangEngine(EngineAdapter[str]):
    """EnginePort for SGLang's native /generate API."""

    engine_kind = EngineKind.SGLANG
    metrics_off_hint = "SGLang /metrics is off (start it with --enable-metrics)"

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        timeouts: EngineTimeouts | None = None,
        retry: RetryPolicy | None = None,
        watch: RestartWatch | None = None,
    ) -> None:
        super().__init__(client, timeouts=timeouts, retry=retry, watch=watch)
        self._layouts: dict[str, CacheLayout] = {}  # box id -> layout of the last /server_info read
        self._epochs: dict[str, str] = {}  # box id -> the last epoch read
        self._pools: dict[str, int | None] = {}  # box id -> `max_total_num_tokens` of the last /server_info
        self._priority_eviction: dict[str, bool] = {}  # box id -> runs --radix-eviction-policy priority
        self._versions: dict[str, str] = {}  # box id -> `version` of the last /server_info

    async def _server_info(self, box: BoxSpec) -> JsonObject:
        """/server_info, or the deprecated /get_server_info on servers that predate it."""
        try:
            info = await self._http.get_json(box, "/server_info", time_limit=self._http.timeouts.health)
        except EngineRejected as exc:
            if exc.status not in (404, 405):
                raise
            info = await self._http.get_json(box, "/get_server_info", time_limit=self._http.timeouts.health)
        self._layouts[box.id] = layout_from_server_info(info)
        self._pools[box.id] = _positive_int(info.get("max_total_num_tokens"))
        self._priority_eviction[box.id] = info.get("radix_eviction_policy") == "priority"
        version = info.get("version")
        self._versions[box.id] = version if isinstance(version, str) else ""
        return info

    async def capacity(self, box: BoxSpec) -> BoxCapacity:
        """The KV token pool (from the /server_info the epoch poll last read: it is fixed per process) and
        the share running requests hold now (`sglang:token_usage`, read fresh). See the module docstring."""
        if box.id not in self._pools:
            await self._server_info(box)
        pool, version = self._pools[box.id], self._versions.get(box.id, "")
        if pool is None:
            return BoxCapacity(source="sglang /server_info without max_total_num_tokens", version=version)
        samples = await self._metrics_if_exposed(box)  # None when --enable-metrics is off
        used = None if samples is None else busiest_share(samples, "sglang:token_usage")
        source = "sglang /server_info max_total_num_tokens, /metrics sglang:token_usage"
        return replace(pool_capacity(pool, used, source), version=version)

    async def cache_layout(self, box: BoxSpec) -> CacheLayout:
        """From the /server_info the epoch poll last read (it changes only with the process), else fresh."""
        layout = self._layouts.get(box.id)
        if layout is None:
            await self._server_info(box)
            layout = self._layouts[box.id]
        return layout

    async def health(self, box: BoxSpec) -> bool:
        """Up on 200, and on a /health timeout while the box still answers (slow, not down). Only a box
        that does not answer at all feeds the restart watch as down: a 503 comes from a live process."""
        answer = await self._http.health_answer(box, "/health")
        if answer.status == 200:
            self._watch.saw_health(box.id, True)
            return True
        if answer.timed_out and await self._answers(box):
            return True
        if (
            answer.status is None
        ):  # no answer at all (refused, or nothing answers in time): a restart may follow
            self._watch.saw_health(box.id, False)
        raise answer.down(box)

    async def _answers(self, box: BoxSpec) -> bool:
        return (await self._http.health_answer(box, "/model_info")).status == 200

    async def epoch(self, box: BoxSpec) -> str:
        """The process identity (see the module docstring). /server_info asks the scheduler for its state
        (http_server.py `server_info` -> `get_internal_state`), so on a busy box it can be as slow as
        /health: when it does not answer but the box does, the last epoch stands (slow is not a restart)."""
        try:
            epoch = await self._epoch(box)
        except EngineUnavailable:
            last = self._epochs.get(box.id)
            if last is not None and await self._answers(box):
                return last
            raise
        self._epochs[box.id] = epoch
        return epoch

    async def _epoch(self, box: BoxSpec) -> str:
        info = await self._server_info(box)
        fingerprint = {key: info.get(key) for key in ("model_path", "random_seed", "version", "port")}
        startup = info.get("startup_time")
        per_process = isinstance(startup, dict) and bool(startup)
        if per_process:
            fingerprint["startup_time"] = startup
        marker = fingerprint_digest(fingerprint, length=12)
        samples = await self._metrics_if_exposed(box)  # None when --enable-metrics is off
        prompts = None if samples is None else metric_sum(samples, "sglang:prompt_tokens_total")
        self._watch.saw_state(box.id, marker=marker, counter=prompts)
        generation = self._watch.generation(box.id)
        if per_process:
            return f"sglang-{marker}-g{generation}"
        return f"sglang-{marker}-{self._watch.epoch(box.id)}"

    async def _prompt_for(self, box: BoxSpec, prefix: Prefix, suffix: str) -> str:
        return prefix.text + suffix

    async def complete_prefix(
        self,
        box: BoxSpec,
        prefix: Prefix,
        *,
        suffix: str = "",
        max_tokens: int = 1,
        slot: int | None = None,
        rank: int | None = None,
    ) -> CompletionReport:
        """`slot` is ignored (SGLang has no pinnable slots). With `rank`, the request names its
        data-parallel rank, so the warm and its probe meet the same cache: `data_parallel_rank` (sglang
        0.5.23 managers/io_struct.py GenerateReqInput: the deprecated alias of `routed_dp_rank`, still
        accepted and mapped to it; earlier releases know only this spelling); the DP controller then
        dispatches to that rank (managers/data_parallel_controller.py:
        `if req.routed_dp_rank is not None`)."""
        prompt = await self._prompt_for(box, prefix, suffix)
        priority = None
        if box.warm_priority is not None:
            if box.id not in self._priority_eviction:
                await self._server_info(box)
            if self._priority_eviction.get(box.id):
                priority = box.warm_priority
        return await self._complete(
            box, prompt, max_tokens=max_tokens, temperature=0.0, rank=rank, priority=priority
        )

    async def _complete(
        self,
        box: BoxSpec,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float,
        json_schema: dict[str, object] | None = None,
        time_limit: float | None = None,
        rank: int | None = None,
        priority: int | None = None,
    ) -> CompletionReport:
        params: JsonObject = {"max_new_tokens": max_tokens, "temperature": temperature}
        if json_schema is not None:
            params["json_schema"] = json.dumps(json_schema)  # SGLang takes the schema as a JSON string
        body: JsonObject = {"text": prompt, "sampling_params": params, "stream": False}
        if rank is not None:
            body["data_parallel_rank"] = rank
        if priority is not None:
            body["priority"] = priority
        response, wall = await self._http.post_json(box, GENERATE_PATH, body, time_limit=time_limit)
        reject_error_body(box, GENERATE_PATH, response, unless="meta_info")
        return parse_generate(box, response, wall, rank=rank)

    async def render_chat(
        self, box: BoxSpec, messages: Sequence[dict[str, object]], tools: Sequence[dict[str, object]]
    ) -> str:
        raise NotSupported(box.id, "SGLang has no endpoint that returns the rendered chat prompt")

    async def tokenize(self, box: BoxSpec, text: str) -> list[int]:
        raise NotSupported(box.id, "tokenize with the model profile's tokenizer file for SGLang boxes")
