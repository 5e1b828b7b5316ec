"""SGLang runtime adapter (native API).

Sources (sgl-project/sglang):
- POST /generate: `text` (or `input_ids`) and `sampling_params` {`max_new_tokens`, `temperature`,
  `json_schema`} (docs/sampling_params.md, docs/basic_usage/native_api.md). The response is
  `{"text": ..., "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens",
  "cached_tokens", ...}}` (python/sglang/srt/managers/tokenizer_manager.py, `_handle_batch_output`:
  `meta_info.update({"completion_tokens": ..., "cached_tokens": recv_obj.cached_tokens[i]})`). Unlike
  `usage.prompt_tokens_details` on the OpenAI routes, `meta_info.cached_tokens` needs no server flag.
  Timings: `meta_info.e2e_latency` (seconds) when present.
- GET /health: 200 when serving, 503 while starting. GET /get_server_info (newer: /server_info): the server
  args, including `model_path` and `random_seed` (drawn at random per launch unless pinned), and `version`.
- GET /metrics (with `--enable-metrics`): `sglang:prompt_tokens_total`, `sglang:cached_tokens_total`
  (labelled by `cache_source` in newer versions: summed), `sglang:cache_hit_rate` (gauge)
  (docs/references/production_metrics.md).

Prompts are sent as text: SGLang tokenizes the same text the same way for the warm, the probe and the chat
requests it renders, and /generate cannot mix token ids with a text suffix.

Hybrid (Mamba-style) models keep a running state only at checkpointed points; the warm executor sends
several prefix+suffix requests and probes until the hit shows (DESIGN.md §4).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import httpx

from warmer.adapters.engines.base import (
    EngineHttp,
    EngineRejected,
    JsonObject,
    RestartWatch,
    check_cached_within_prompt,
    count_field,
    metric_sum,
    optional_seconds,
    parse_metrics,
)
from warmer.adapters.engines.openai import process_start_time
from warmer.core.errors import EngineError, MalformedResponse, NotSupported
from warmer.core.model import BoxSpec, CacheStats, CompletionReport, EngineTimeouts, Prefix, RetryPolicy

GENERATE_PATH = "/generate"


def parse_generate(box: BoxSpec, body: JsonObject, wall_seconds: float) -> CompletionReport:
    """`meta_info.prompt_tokens` and `meta_info.cached_tokens`, checked."""
    prompt_tokens = count_field(box, GENERATE_PATH, body, "meta_info.prompt_tokens")
    cached = count_field(
        box, GENERATE_PATH, body, "meta_info.cached_tokens", cache_field=True,
        hint="SGLang too old to report meta_info.cached_tokens",
    )  # fmt: skip
    check_cached_within_prompt(box, GENERATE_PATH, prompt_tokens, cached)
    text = body.get("text")
    return CompletionReport(
        prompt_tokens=prompt_tokens,
        cached_tokens=cached,
        wall_seconds=wall_seconds,
        engine_seconds=optional_seconds(body, "meta_info.e2e_latency"),
        text=text if isinstance(text, str) else "",
    )


class SglangEngine:
    """EnginePort for SGLang's native /generate API."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        timeouts: EngineTimeouts | None = None,
        retry: RetryPolicy | None = None,
        watch: RestartWatch | None = None,
    ) -> None:
        self._http = EngineHttp(client, timeouts=timeouts, retry=retry)
        self._watch = watch or RestartWatch()

    async def health(self, box: BoxSpec) -> bool:
        up = await self._http.status(box, "/health") == 200
        self._watch.saw_health(box.id, up)
        return up

    async def _server_info(self, box: BoxSpec) -> JsonObject:
        try:
            return await self._http.get_json(box, "/get_server_info", time_limit=self._http.timeouts.health)
        except EngineRejected as exc:
            if exc.status not in (404, 405):
                raise
        return await self._http.get_json(box, "/server_info", time_limit=self._http.timeouts.health)

    async def epoch(self, box: BoxSpec) -> str:
        try:
            text = await self._http.get_text(box, "/metrics", time_limit=self._http.timeouts.health)
            started = process_start_time(box, text)
        except EngineRejected:
            started = None  # --enable-metrics is off
        if started is not None:
            return f"sglang-start-{started!r}"
        info = await self._server_info(box)
        fingerprint = {key: info.get(key) for key in ("model_path", "random_seed", "version", "port")}
        marker = hashlib.sha256(json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()[
            :12
        ]
        self._watch.saw_state(box.id, marker=marker)
        return f"sglang-{marker}-{self._watch.epoch(box.id)}"

    async def complete_prefix(
        self, box: BoxSpec, prefix: Prefix, *, suffix: str = "", max_tokens: int = 1
    ) -> CompletionReport:
        return await self._generate(
            box, prefix.text + suffix, {"max_new_tokens": max_tokens, "temperature": 0.0}
        )

    async def complete_prompt(
        self,
        box: BoxSpec,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        json_schema: dict[str, object] | None = None,
    ) -> CompletionReport:
        params: JsonObject = {"max_new_tokens": max_tokens, "temperature": temperature}
        if json_schema is not None:
            params["json_schema"] = json.dumps(json_schema)  # SGLang takes the schema as a JSON string
        return await self._generate(box, prompt, params, time_limit=self._http.timeouts.long_request)

    async def _generate(
        self, box: BoxSpec, text: str, sampling_params: JsonObject, *, time_limit: float | None = None
    ) -> CompletionReport:
        body: JsonObject = {"text": text, "sampling_params": sampling_params, "stream": False}
        response, wall = await self._http.post_json(box, GENERATE_PATH, body, time_limit=time_limit)
        if "error" in response and "meta_info" not in response:
            raise EngineError(box.id, f"{GENERATE_PATH} returned an error: {response['error']!r}")
        return parse_generate(box, response, wall)

    async def render_chat(
        self, box: BoxSpec, messages: Sequence[dict[str, object]], tools: Sequence[dict[str, object]]
    ) -> str:
        raise NotSupported(box.id, "SGLang has no endpoint that returns the rendered chat prompt")

    async def tokenize(self, box: BoxSpec, text: str) -> list[int]:
        raise NotSupported(box.id, "tokenize with the model profile's tokenizer file for SGLang boxes")

    async def cache_stats(self, box: BoxSpec) -> CacheStats:
        try:
            text = await self._http.get_text(box, "/metrics", time_limit=self._http.timeouts.health)
        except EngineRejected as exc:
            raise NotSupported(box.id, "SGLang /metrics is off (start it with --enable-metrics)") from exc
        samples = parse_metrics(box, text)
        prompt = metric_sum(samples, "sglang:prompt_tokens_total")
        cached = metric_sum(samples, "sglang:cached_tokens_total")
        # A gauge: with several series (one per DP rank) no single rate is honest, so report none.
        rate_values = [s.value for s in samples if s.name == "sglang:cache_hit_rate"]
        rate = rate_values[0] if len(rate_values) == 1 else None
        if prompt is None and cached is None and rate is None:
            raise MalformedResponse(box.id, "/metrics lacks sglang:prompt_tokens_total / cached_tokens_total")
        return CacheStats(queried_tokens=prompt, hit_tokens=cached, hit_rate=rate)
