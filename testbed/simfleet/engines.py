"""The answers of each engine kind, in the shapes warmer's adapters read (warmer/adapters/engines/*.py) and
the real engines send (the bodies recorded in tests/unit/engine_shapes.py cite their sources):

- llama.cpp `llama-server`: GET /health, /props (`total_slots`, `default_generation_settings.n_ctx`,
  `media_marker` drawn per process), /slots, /metrics (`llamacpp:prompt_tokens_total` computed tokens,
  `llamacpp:prompt_tokens_cached_total`, `llamacpp:n_decode_total`); POST /completion (`timings.cache_n`,
  `timings.prompt_n`, `prompt_ms`), /tokenize, /apply-template, /v1/completions and /v1/chat/completions
  (`usage.prompt_tokens_details.cached_tokens` plus `timings`).
- vLLM: GET /health (empty 200), /v1/models, /metrics (`process_start_time_seconds`, the prefix-cache
  queries/hits counters, `vllm:cache_config_info` with `block_size` and `num_gpu_blocks`,
  `vllm:kv_cache_usage_perc`); POST /v1/completions, /v1/chat/completions (details null when nothing was
  cached, as vLLM sends), /tokenize, /detokenize.
- SGLang: GET /health, /model_info, /server_info and /get_server_info (`random_seed`, `startup_time`,
  `page_size`, `max_total_num_tokens`), /metrics (`sglang:prompt_tokens_total`,
  `sglang:cached_tokens_total` by `cache_source`, `sglang:token_usage`); POST /generate (`meta_info`),
  /v1/completions.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from testbed.simfleet.box import BoxRestarted, HealthMode, SimBox, SimEngine
from testbed.simfleet.tokens import PromptError, SimTokenizer, prompt_ids, render_chatml

BUILD_INFO = "b6999-simfleet"


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "application/json"

    @classmethod
    def json(cls, value: Any, status: int = 200) -> Reply:
        return cls(status, json.dumps(value, separators=(",", ":")).encode())

    @classmethod
    def text(cls, value: str, status: int = 200) -> Reply:
        return cls(status, value.encode(), "text/plain; version=0.0.4; charset=utf-8")


NOT_FOUND = Reply.json({"detail": "Not Found"}, 404)


def loading_reply(engine: SimEngine) -> Reply:
    if engine is SimEngine.LLAMACPP:  # tools/server: 503 with an error object while the model loads
        return Reply.json(
            {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}, 503
        )
    return Reply(503, b"")


def bad_request(message: str) -> Reply:
    return Reply.json({"error": {"code": 400, "message": message, "type": "invalid_request_error"}}, 400)


Handler = Callable[[SimBox, dict[str, Any], dict[str, str]], Awaitable[Reply]]


class EngineRoutes:
    """Every route of one engine kind over boxes of that kind; `answer` is the entry point."""

    def __init__(self, engine: SimEngine, tokenizer: SimTokenizer) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        common: dict[tuple[str, str], Handler] = {
            ("GET", "/health"): self._health,
            ("GET", "/metrics"): self._metrics,
            ("POST", "/v1/completions"): self._openai_completion,
        }
        kinds: dict[SimEngine, dict[tuple[str, str], Handler]] = {
            SimEngine.LLAMACPP: {
                ("GET", "/props"): self._props,
                ("GET", "/slots"): self._slots,
                ("POST", "/completion"): self._llama_completion,
                ("POST", "/tokenize"): self._llama_tokenize,
                ("POST", "/apply-template"): self._apply_template,
                ("POST", "/v1/chat/completions"): self._openai_chat,
            },
            SimEngine.VLLM: {
                ("GET", "/v1/models"): self._models,
                ("POST", "/tokenize"): self._vllm_tokenize,
                ("POST", "/detokenize"): self._detokenize,
                ("POST", "/v1/chat/completions"): self._openai_chat,
            },
            SimEngine.SGLANG: {
                ("GET", "/model_info"): self._model_info,
                ("GET", "/server_info"): self._server_info,
                ("GET", "/get_server_info"): self._server_info,
                ("GET", "/v1/models"): self._models,
                ("POST", "/generate"): self._generate,
            },
        }
        self.routes = {**common, **kinds[engine]}

    async def answer(
        self, box: SimBox, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> Reply:
        handler = self.routes.get((method, path))
        if handler is None:
            return NOT_FOUND
        if box.is_down():
            return loading_reply(self.engine)
        parsed: dict[str, Any] = {}
        if method == "POST":
            try:
                value = json.loads(body or b"{}")
            except ValueError:
                return bad_request("the body is not JSON")
            if not isinstance(value, dict):
                return bad_request("the body must be a JSON object")
            parsed = value
        try:
            return await handler(box, parsed, headers)
        except PromptError as exc:
            return bad_request(str(exc))
        except BoxRestarted:
            return loading_reply(self.engine)

    # -- health and identity -----------------------------------------------------------------------

    async def _health(self, box: SimBox, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        if box.health is HealthMode.FAIL:
            return loading_reply(self.engine)
        if box.health is HealthMode.SLOW:
            await asyncio.sleep(box.health_delay_seconds)
        return Reply.json({"status": "ok"}) if self.engine is SimEngine.LLAMACPP else Reply(200, b"")

    async def _props(self, box: SimBox, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        config = box.config
        return Reply.json(
            {
                "default_generation_settings": {
                    "id": 0,
                    "n_ctx": config.context_tokens,
                    "speculative": False,
                    "is_processing": False,
                    "params": {"n_predict": -1},
                },
                "total_slots": config.slots,
                "model_path": f"/models/{config.model}.gguf",
                "modalities": {"vision": False, "audio": False},
                "chat_template": "",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "build_info": BUILD_INFO,
                "media_marker": f"<__media_{box.identity.marker}__>",
            }
        )

    async def _slots(self, box: SimBox, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        busy = box.running
        return Reply.json(
            [
                {
                    "id": slot,
                    "n_ctx": box.config.context_tokens,
                    "speculative": False,
                    "is_processing": slot < busy,
                }
                for slot in range(box.config.slots)
            ]
        )

    async def _models(self, box: SimBox, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        created = int(box.identity.started_at)
        owner = "vllm" if self.engine is SimEngine.VLLM else "sglang"
        return Reply.json(
            {
                "object": "list",
                "data": [
                    {
                        "id": box.config.model,
                        "object": "model",
                        "created": created,
                        "owned_by": owner,
                        "root": box.config.model,
                        "max_model_len": box.config.context_tokens,
                    },
                ],
            }
        )

    async def _model_info(self, box: SimBox, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        model = f"/models/{box.config.model}"
        return Reply.json({"model_path": model, "tokenizer_path": model, "is_generation": True})

    async def _server_info(self, box: SimBox, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        config = box.config
        return Reply.json(
            {
                "model_path": f"/models/{config.model}",
                "random_seed": box.identity.seed,
                "page_size": config.block_tokens,
                "port": 30000,
                "dp_size": 1,
                "radix_eviction_policy": "lru",
                "max_total_num_tokens": config.cache_tokens,
                "max_req_input_len": config.context_tokens - 1,
                "version": "0.5.23",
                "startup_time": box.identity.startup,
                "internal_states": [{"last_gen_throughput": 0.0}],
            }
        )

    async def _metrics(self, box: SimBox, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        return Reply.text(metrics_text(box))

    # -- tokenizing -------------------------------------------------------------------------------

    async def _llama_tokenize(self, box: SimBox, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        content = body.get("content")
        if not isinstance(content, str):
            raise PromptError("'content' must be a string")
        return Reply.json(
            {"tokens": self.tokenizer.encode(content, add_special=bool(body.get("add_special")))}
        )

    async def _apply_template(self, box: SimBox, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        return Reply.json({"prompt": render_chatml(body.get("messages"))})

    async def _vllm_tokenize(self, box: SimBox, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        if "messages" in body:
            text = render_chatml(
                body["messages"], add_generation_prompt=body.get("add_generation_prompt", True)
            )
            ids = self.tokenizer.encode(text, add_special=bool(body.get("add_special_tokens", False)))
        elif isinstance(body.get("prompt"), str):
            ids = self.tokenizer.encode(
                body["prompt"], add_special=bool(body.get("add_special_tokens", True))
            )
        else:
            raise PromptError("'prompt' must be a string (or give 'messages')")
        return Reply.json(
            {"count": len(ids), "max_model_len": box.config.context_tokens, "tokens": ids, "token_strs": None}
        )

    async def _detokenize(self, box: SimBox, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        ids = prompt_ids(self.tokenizer, body.get("tokens"))
        return Reply.json({"prompt": self.tokenizer.decode(ids)})

    # -- completions ------------------------------------------------------------------------------

    async def _llama_completion(self, box: SimBox, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        ids = prompt_ids(self.tokenizer, body.get("prompt"), mixed=True)
        slot = body.get("id_slot")
        return Reply.json(await llama_answer(box, ids, _max_tokens(body, "n_predict", 16), slot))

    async def _openai_completion(self, box: SimBox, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        ids = prompt_ids(self.tokenizer, body.get("prompt"), mixed=self.engine is SimEngine.LLAMACPP)
        return Reply.json(
            await self._openai_answer(box, ids, _max_tokens(body, "max_tokens", 16), "text_completion")
        )

    async def _openai_chat(self, box: SimBox, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        ids = self.tokenizer.encode(render_chatml(body.get("messages")), add_special=True)
        max_tokens = _max_tokens(body, "max_tokens", _max_tokens(body, "max_completion_tokens", 16))
        return Reply.json(await self._openai_answer(box, ids, max_tokens, "chat.completion"))

    async def _openai_answer(self, box: SimBox, ids: list[int], max_tokens: int, kind: str) -> dict[str, Any]:
        lookup, prefill, decode = await box.run(ids, max_tokens)
        cached = lookup.cached_tokens
        details: dict[str, int] | None = {"cached_tokens": cached}
        if self.engine is SimEngine.VLLM and not cached:
            details = None  # vLLM sets the details only when the count is truthy (serving_completion.py)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length"}
        if kind == "chat.completion":
            choice["message"] = {"role": "assistant", "content": "!" * max_tokens}
        else:
            choice["text"] = "!" * max_tokens
        answer: dict[str, Any] = {
            "id": f"cmpl-{uuid.uuid4().hex[:16]}",
            "object": kind,
            "created": int(time.time()),
            "model": box.config.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": lookup.prompt_tokens,
                "completion_tokens": max_tokens,
                "total_tokens": lookup.prompt_tokens + max_tokens,
                "prompt_tokens_details": details,
            },
        }
        if self.engine is SimEngine.LLAMACPP:
            answer["timings"] = _timings(
                lookup.cached_tokens, lookup.prompt_tokens, prefill, decode, max_tokens
            )
        return answer

    async def _generate(self, box: SimBox, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        text, input_ids = body.get("text"), body.get("input_ids")
        if isinstance(text, str):
            ids = self.tokenizer.encode(text, add_special=True)
        elif input_ids is not None:
            ids = prompt_ids(self.tokenizer, input_ids)
        else:
            raise PromptError("give 'text' or 'input_ids'")
        params = body.get("sampling_params")
        max_tokens = _max_tokens(params if isinstance(params, dict) else {}, "max_new_tokens", 128)
        started = time.monotonic()
        lookup, _, _ = await box.run(ids, max_tokens)
        return Reply.json(
            {
                "text": "!" * max_tokens,
                "meta_info": {
                    "id": uuid.uuid4().hex,
                    "finish_reason": {"type": "length", "length": max_tokens},
                    "prompt_tokens": lookup.prompt_tokens,
                    "completion_tokens": max_tokens,
                    "cached_tokens": lookup.cached_tokens,
                    "e2e_latency": time.monotonic() - started,
                },
            }
        )


def _max_tokens(body: dict[str, Any], name: str, default: int) -> int:
    value = body.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PromptError(f"'{name}' must be a non-negative integer")
    return value


def _timings(
    cached: int, prompt: int, prefill: float, decode: float, predicted: int
) -> dict[str, float | int]:
    computed = prompt - cached
    prompt_ms, predicted_ms = prefill * 1000.0, decode * 1000.0
    return {
        "cache_n": cached,
        "prompt_n": computed,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / max(1, computed),
        "prompt_per_second": computed / prefill if prefill > 0 else 0.0,
        "predicted_n": predicted,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / max(1, predicted),
        "predicted_per_second": predicted / decode if decode > 0 else 0.0,
    }


async def llama_answer(box: SimBox, ids: list[int], max_tokens: int, slot: object = None) -> dict[str, Any]:
    """A llama-server /completion answer (tools/server/README.md, POST /completion); `id_slot` is the slot
    the request ran in (the one it named: warmer pins each prefix to a slot by what the answer says)."""
    lookup, prefill, decode = await box.run(ids, max_tokens)
    return {
        "content": "!" * max_tokens,
        "id_slot": box.slot_for(slot),
        "stop": True,
        "model": f"/models/{box.config.model}.gguf",
        "tokens_predicted": max_tokens,
        "tokens_evaluated": lookup.prompt_tokens,
        "tokens_cached": lookup.prompt_tokens + max_tokens,
        "stop_type": "limit",
        "stopping_word": "",
        "truncated": False,
        "timings": _timings(lookup.cached_tokens, lookup.prompt_tokens, prefill, decode, max_tokens),
    }


def _exposition(samples: list[tuple[str, str, str, float | int]]) -> str:
    """Prometheus text from (name, type, labels, value), one TYPE line per name."""
    lines: list[str] = []
    typed: set[str] = set()
    for name, kind, labels, value in samples:
        if name not in typed:
            typed.add(name)
            lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name}{{{labels}}} {value!r}" if labels else f"{name} {value!r}")
    return "\n".join(lines) + "\n"


def metrics_text(box: SimBox) -> str:
    """The box's /metrics in its engine's names (Prometheus text exposition)."""
    c, model, config = box.counters, box.config.model, box.config
    queried = float(c.processed_tokens + c.cached_tokens)
    if config.engine is SimEngine.LLAMACPP:
        return _exposition(
            [
                ("llamacpp:prompt_tokens_total", "counter", "", c.processed_tokens),
                ("llamacpp:prompt_tokens_cached_total", "counter", "", c.cached_tokens),
                ("llamacpp:tokens_predicted_total", "counter", "", c.generated_tokens),
                ("llamacpp:n_decode_total", "counter", "", c.decodes),
                ("llamacpp:requests_processing", "gauge", "", box.running),
            ]
        )
    if config.engine is SimEngine.VLLM:
        labels = f'engine="0",model_name="{model}"'
        info = (
            f'block_size="{config.block_tokens}",cache_dtype="auto",engine="0",enable_prefix_caching="True",'
            f'num_gpu_blocks="{config.cache_tokens // config.block_tokens}"'
        )
        return _exposition(
            [
                ("process_start_time_seconds", "gauge", "", box.identity.started_at),
                (
                    "vllm:prefix_cache_queries_total",
                    "counter",
                    labels,
                    float(c.processed_tokens + c.cached_tokens),
                ),
                ("vllm:prefix_cache_hits_total", "counter", labels, float(c.cached_tokens)),
                ("vllm:num_requests_running", "gauge", labels, float(box.running)),
                ("vllm:kv_cache_usage_perc", "gauge", labels, box.used_share()),
                ("vllm:cache_config_info", "gauge", info, 1.0),
            ]
        )
    labels = f'model_name="{model}"'
    return _exposition(
        [
            ("sglang:prompt_tokens_total", "counter", labels, queried),
            (
                "sglang:cached_tokens_total",
                "counter",
                f'{labels},cache_source="device"',
                float(c.cached_tokens),
            ),
            ("sglang:token_usage", "gauge", labels, box.used_share()),
            ("sglang:num_running_reqs", "gauge", labels, float(box.running)),
        ]
    )
