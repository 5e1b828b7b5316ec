"""Generic OpenAI-compatible engine adapter (any server speaking `/v1/completions`).

Sources:
- OpenAI API reference, Completions: `prompt` is a string or an array of token ids; the response `usage` has
  `prompt_tokens` and `prompt_tokens_details.cached_tokens`
  (https://platform.openai.com/docs/api-reference/completions/object).
- vLLM fills `usage.prompt_tokens_details.cached_tokens` only with `--enable-prompt-tokens-details`
  (vllm/entrypoints/openai/cli_args.py, `enable_prompt_tokens_details`); SGLang only with
  `--enable-cache-report` (sgl-project/sglang python/sglang/srt/server_args.py: "Return number of cached
  tokens in usage.prompt_tokens_details"); llama-server always (tools/server/README.md, "Timings and context
  usage"). A body without `usage.prompt_tokens_details` is a CacheFieldMissing, never a cached count of 0.
- `prompt_tokens_details: null` is 0 cached: vLLM sets the details only when the count is truthy
  (vllm-project/vllm vllm/entrypoints/openai/serving_completion.py @ 2d5f987dff069848e428593c21df021d02d4282a:
  `if self.enable_prompt_tokens_details and num_cached_tokens:`), older SGLang OpenAI routes likewise.
  It is also what a server with cache reporting off sends (SGLang 0.5.23
  sglang/srt/entrypoints/openai/usage_processor.py: details only `if enable_cache_report`), so the
  report carries a note naming both readings, shown when a warm does not verify.

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
    EngineAdapter,
    check_cached_within_prompt,
    count_field,
    dig,
    reject_error_body,
)
from warmer.adapters.engines.http import EngineRejected, HealthAnswer, JsonObject, box_url
from warmer.adapters.engines.restart_watch import RestartWatch
from warmer.core.errors import EngineUnavailable, MalformedResponse, NotSupported
from warmer.core.model import (
    BoxSpec,
    CacheLayout,
    CompletionReport,
    EngineKind,
    EngineTimeouts,
    Prefix,
    RetryPolicy,
)

COMPLETIONS_PATH = "/v1/completions"
CACHE_FIELD = "usage.prompt_tokens_details.cached_tokens"


def parse_openai_completion(
    box: BoxSpec, body: JsonObject, wall_seconds: float, *, hint: str = ""
) -> CompletionReport:
    """`usage.prompt_tokens` and `usage.prompt_tokens_details.cached_tokens`, checked; text of choice 0."""
    prompt_tokens = count_field(box, COMPLETIONS_PATH, body, "usage.prompt_tokens")
    usage = body.get("usage")
    note: str | None = None
    details_null = isinstance(usage, Mapping) and "prompt_tokens_details" in usage
    details_null = details_null and dig(body, "usage.prompt_tokens_details") is None
    if details_null:
        cached = 0
        note = "the engine sent prompt_tokens_details: null (0 cached, or cache reporting is off"
        note += f": {hint})" if hint else ")"
    else:
        cached = count_field(box, COMPLETIONS_PATH, body, CACHE_FIELD, cache_field=True, hint=hint)
    check_cached_within_prompt(box, COMPLETIONS_PATH, prompt_tokens, cached)
    choices = body.get("choices")
    text = ""
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        value = choices[0].get("text")
        text = value if isinstance(value, str) else ""
    return CompletionReport(
        prompt_tokens=prompt_tokens,
        cached_tokens=cached,
        wall_seconds=wall_seconds,
        text=text,
        cache_note=note,
    )


class OpenAICompatibleEngine(EngineAdapter[list[int]]):
    """EnginePort over `/v1/completions`; the base for engines whose hit report lives in `usage`."""

    cache_hint = "the server does not report usage.prompt_tokens_details.cached_tokens"
    kind = "openai"
    engine_kind = EngineKind.OPENAI  # /metrics counters of whichever engine the names say it is

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
        super().__init__(client, timeouts=timeouts, retry=retry, watch=watch)
        self._client = client
        self._served_models = dict(served_models or {})
        self._discovered_models: dict[str, str] = {}
        self._epoch_header = epoch_header
        self._layouts: dict[str, CacheLayout] = {}  # box id -> layout the server last reported

    # -- health and identity ---------------------------------------------------------------------

    async def _health_answer(self, box: BoxSpec) -> HealthAnswer:
        answer = await self._http.health_answer(box, "/health")
        if answer.status in (404, 405):
            answer = await self._http.health_answer(box, "/v1/models")  # servers without a /health route
        return answer

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

    async def _add_model(self, box: BoxSpec, body: JsonObject) -> None:
        """Name the model in a request body when one is known (see `_model_for`)."""
        model = await self._model_for(box)
        if model is not None:
            body["model"] = model

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

    def _request_extras(self, box: BoxSpec) -> JsonObject:
        """Engine-specific fields of every completion request to the box."""
        return {}

    async def _complete(
        self,
        box: BoxSpec,
        prompt: str | list[int],
        *,
        max_tokens: int,
        temperature: float,
        json_schema: dict[str, object] | None = None,
        time_limit: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> CompletionReport:
        body: JsonObject = {
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": False,
        }
        await self._add_model(box, body)
        body.update(self._request_extras(box))
        if json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "warmup", "schema": json_schema},
            }
        response, wall = await self._http.post_json(
            box, COMPLETIONS_PATH, body, time_limit=time_limit, headers=headers
        )
        reject_error_body(box, COMPLETIONS_PATH, response, unless="usage")
        return parse_openai_completion(box, response, wall, hint=self.cache_hint)

    # -- tokenizing and stats --------------------------------------------------------------------

    async def render_chat(
        self, box: BoxSpec, messages: Sequence[dict[str, object]], tools: Sequence[dict[str, object]]
    ) -> str:
        raise NotSupported(box.id, "a generic OpenAI-compatible server cannot render chat templates for us")

    async def tokenize(self, box: BoxSpec, text: str) -> list[int]:
        raise NotSupported(box.id, "a generic OpenAI-compatible server has no tokenize endpoint")
