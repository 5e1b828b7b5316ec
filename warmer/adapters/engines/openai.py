"""Generic OpenAI-compatible engine adapter (any server speaking `/v1/completions`).

Sources:
- OpenAI API reference, Completions: `prompt` is a string or an array of token ids; the response `usage` has
  `prompt_tokens` and `prompt_tokens_details.cached_tokens`
  (https://platform.openai.com/docs/api-reference/completions/object).
- vLLM fills `usage.prompt_tokens_details.cached_tokens` only with `--enable-prompt-tokens-details`
  (vllm/entrypoints/openai/cli_args.py, `enable_prompt_tokens_details`); SGLang only with
  `--enable-cache-report` (sgl-project/sglang python/sglang/srt/server_args.py: "Return number of cached
  tokens in usage.prompt_tokens_details"); llama-server always (tools/server/README.md, "Timings and context
  usage"). A body without it is a CacheFieldMissing, never a cached count of 0.

Prompts are always sent as text here: a generic server's tokenizer is unknown to us, and sending the same
text for the warm and the probe is what keeps the two on the same tokens.

Epoch: `process_start_time_seconds` from `/metrics` when the server exposes the Prometheus process collector
(a real process identity), else an optional response header naming the instance (`epoch_header`), else a
`RestartWatch` (health down/up seen by this adapter, model list changes), which also changes whenever
warmer itself restarts: without an engine-side identity, re-verifying is the only honest choice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import httpx

from warmer.adapters.engines.base import (
    EngineHttp,
    EngineRejected,
    JsonObject,
    RestartWatch,
    box_url,
    check_cached_within_prompt,
    count_field,
    dig,
    metric_sum,
    parse_metrics,
)
from warmer.core.errors import EngineError, EngineUnavailable, MalformedResponse, NotSupported
from warmer.core.model import BoxSpec, CacheStats, CompletionReport, EngineTimeouts, Prefix, RetryPolicy

COMPLETIONS_PATH = "/v1/completions"
CACHE_FIELD = "usage.prompt_tokens_details.cached_tokens"


def parse_openai_completion(
    box: BoxSpec, body: JsonObject, wall_seconds: float, *, hint: str = ""
) -> CompletionReport:
    """`usage.prompt_tokens` and `usage.prompt_tokens_details.cached_tokens`, checked; text of choice 0."""
    prompt_tokens = count_field(box, COMPLETIONS_PATH, body, "usage.prompt_tokens")
    cached = count_field(box, COMPLETIONS_PATH, body, CACHE_FIELD, cache_field=True, hint=hint)
    check_cached_within_prompt(box, COMPLETIONS_PATH, prompt_tokens, cached)
    choices = body.get("choices")
    text = ""
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        value = choices[0].get("text")
        text = value if isinstance(value, str) else ""
    return CompletionReport(
        prompt_tokens=prompt_tokens, cached_tokens=cached, wall_seconds=wall_seconds, text=text
    )


def process_start_time(box: BoxSpec, metrics_text: str) -> float | None:
    """Prometheus client's `process_start_time_seconds` (unix seconds the process started), if exposed.

    With several series (multiprocess servers) the earliest is the server's own start.
    """
    values = [s.value for s in parse_metrics(box, metrics_text) if s.name == "process_start_time_seconds"]
    return min(values) if values else None


class OpenAICompatibleEngine:
    """EnginePort over `/v1/completions`; the base for engines whose hit report lives in `usage`."""

    cache_hint = "the server does not report usage.prompt_tokens_details.cached_tokens"
    kind = "openai"

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        timeouts: EngineTimeouts | None = None,
        retry: RetryPolicy | None = None,
        served_models: Mapping[str, str] | None = None,
        epoch_header: str | None = None,
        watch: RestartWatch | None = None,
    ) -> None:
        self._client = client
        self._http = EngineHttp(client, timeouts=timeouts, retry=retry)
        self._served_models = dict(served_models or {})
        self._discovered_models: dict[str, str] = {}
        self._epoch_header = epoch_header
        self._watch = watch or RestartWatch()

    # -- health and identity ---------------------------------------------------------------------

    async def health(self, box: BoxSpec) -> bool:
        status = await self._http.status(box, "/health")
        if status in (404, 405):
            status = await self._http.status(box, "/v1/models")  # servers without a /health route
        up = status == 200
        self._watch.saw_health(box.id, up)
        return up

    async def epoch(self, box: BoxSpec) -> str:
        started = await self._process_start(box)
        if started is not None:
            return f"{self.kind}-start-{started!r}"
        if self._epoch_header:
            value = await self._header_epoch(box, self._epoch_header)
            if value:
                return f"{self.kind}-header-{value}"
        self._watch.saw_state(box.id, marker=await self._marker(box))
        return f"{self.kind}-{self._watch.epoch(box.id)}"

    async def _process_start(self, box: BoxSpec) -> float | None:
        try:
            text = await self._http.get_text(box, "/metrics", time_limit=self._http.timeouts.health)
        except EngineRejected:
            return None
        return process_start_time(box, text)

    async def _header_epoch(self, box: BoxSpec, header: str) -> str | None:
        try:
            response = await self._client.get(
                box_url(box, "/v1/models"), timeout=httpx.Timeout(self._http.timeouts.health)
            )
        except httpx.HTTPError as exc:
            raise EngineUnavailable(box.id, f"GET /v1/models failed: {type(exc).__name__}") from exc
        value = response.headers.get(header)
        return str(value) if value else None

    async def _marker(self, box: BoxSpec) -> str | None:
        """What identifies the served model set; a change means a different process."""
        try:
            body = await self._http.get_json(box, "/v1/models", time_limit=self._http.timeouts.health)
        except EngineRejected:
            return None
        data = body.get("data")
        if not isinstance(data, list):
            return None
        ids = sorted(str(item.get("id")) for item in data if isinstance(item, Mapping))
        return ",".join(ids)

    async def _model_for(self, box: BoxSpec) -> str | None:
        """The `model` field: the profile's served name if configured, else the server's first model."""
        if box.model in self._served_models:
            return self._served_models[box.model]
        if box.id in self._discovered_models:
            return self._discovered_models[box.id]
        body = await self._http.get_json(box, "/v1/models", time_limit=self._http.timeouts.health)
        data = body.get("data")
        first = (
            dig(data[0], "id") if isinstance(data, list) and data and isinstance(data[0], Mapping) else None
        )
        if not isinstance(first, str) or not first:
            raise MalformedResponse(box.id, "/v1/models lists no model id; configure served_model_name")
        self._discovered_models[box.id] = first
        return first

    # -- completions -------------------------------------------------------------------------------

    async def _prompt_for(self, box: BoxSpec, prefix: Prefix, suffix: str) -> str | list[int]:
        return prefix.text + suffix

    async def complete_prefix(
        self, box: BoxSpec, prefix: Prefix, *, suffix: str = "", max_tokens: int = 1
    ) -> CompletionReport:
        prompt = await self._prompt_for(box, prefix, suffix)
        return await self._complete(box, prompt, max_tokens=max_tokens, temperature=0.0)

    async def complete_prompt(
        self,
        box: BoxSpec,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        json_schema: dict[str, object] | None = None,
    ) -> CompletionReport:
        return await self._complete(
            box,
            prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            json_schema=json_schema,
            time_limit=self._http.timeouts.long_request,
        )

    async def _complete(
        self,
        box: BoxSpec,
        prompt: str | list[int],
        *,
        max_tokens: int,
        temperature: float,
        json_schema: dict[str, object] | None = None,
        time_limit: float | None = None,
    ) -> CompletionReport:
        body: JsonObject = {
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": False,
        }
        model = await self._model_for(box)
        if model is not None:
            body["model"] = model
        if json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "warmup", "schema": json_schema},
            }
        response, wall = await self._http.post_json(box, COMPLETIONS_PATH, body, time_limit=time_limit)
        if "error" in response and "usage" not in response:
            raise EngineError(box.id, f"{COMPLETIONS_PATH} returned an error: {response['error']!r}")
        return parse_openai_completion(box, response, wall, hint=self.cache_hint)

    # -- tokenizing and stats --------------------------------------------------------------------

    async def render_chat(
        self, box: BoxSpec, messages: Sequence[dict[str, object]], tools: Sequence[dict[str, object]]
    ) -> str:
        raise NotSupported(box.id, "a generic OpenAI-compatible server cannot render chat templates for us")

    async def tokenize(self, box: BoxSpec, text: str) -> list[int]:
        raise NotSupported(box.id, "a generic OpenAI-compatible server has no tokenize endpoint")

    async def cache_stats(self, box: BoxSpec) -> CacheStats:
        try:
            text = await self._http.get_text(box, "/metrics", time_limit=self._http.timeouts.health)
        except EngineRejected as exc:
            raise NotSupported(box.id, "the server exposes no /metrics") from exc
        samples = parse_metrics(box, text)
        queries = metric_sum(samples, "vllm:prefix_cache_queries_total")
        hits = metric_sum(samples, "vllm:prefix_cache_hits_total")
        if queries is not None and hits is not None:
            return CacheStats(queried_tokens=queries, hit_tokens=hits)
        prompt = metric_sum(samples, "sglang:prompt_tokens_total")
        cached = metric_sum(samples, "sglang:cached_tokens_total")
        rate = metric_sum(samples, "sglang:cache_hit_rate")
        if prompt is not None or cached is not None or rate is not None:
            return CacheStats(queried_tokens=prompt, hit_tokens=cached, hit_rate=rate)
        raise NotSupported(box.id, "/metrics has no prefix-cache counters this adapter knows")
