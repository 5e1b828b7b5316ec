"""A real vLLM (CPU) server on the tiny HF model: what the vLLM adapter relies on, as the server reports it.

Sources (vLLM 0.32.0, vllm-project/vllm):
- `usage.prompt_tokens_details.cached_tokens` on /v1/completions needs `--enable-prompt-tokens-details`
  (`vllm/entrypoints/launchers/cli_args.py`); hits need `--enable-prefix-caching`.
- The CPU platform sets the KV block size to 128 unless one is given (`vllm/platforms/cpu.py`), and a
  full hit still recomputes the last token, so at most `num_tokens - 1` rounded down to a block is reused
  (`vllm/v1/core/kv_cache_manager.py`, `get_computed_blocks`:
  "max_cache_hit_length = request.num_tokens - 1").
- POST /tokenize takes either `prompt` (TokenizeCompletionRequest, `add_special_tokens` default true) or
  `messages` (TokenizeChatRequest, `add_generation_prompt` default true, `add_special_tokens` default false,
  optional `tools`) and answers `{count, max_model_len, tokens, token_strs}`
  (`vllm/entrypoints/serve/tokenize/protocol.py`).
- /metrics: `vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total` count tokens
  (`vllm/v1/metrics/loggers.py`); `process_start_time_seconds` is prometheus_client's default process
  collector (seconds since the Unix epoch) of the API server process.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testbed.tiny_hf_model import CHATML_TEMPLATE
from testbed.vllm_server import CPU_BLOCK_SIZE, VllmServer

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


@pytest.fixture
def client(vllm_server: VllmServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=vllm_server.base_url, timeout=120.0) as http:
        yield http


def unique_prompt(n_bytes: int) -> str:
    """Plain ASCII unlike any other test's prompt from the FIRST byte, so no test sees another's cache."""
    rng = random.Random(uuid.uuid4().int)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(n_bytes))


def complete(client: httpx.Client, server: VllmServer, prompt: str) -> dict[str, Any]:
    response = client.post(
        "/v1/completions",
        json={"model": server.served_model_name, "prompt": prompt, "max_tokens": 1, "temperature": 0},
    )
    response.raise_for_status()
    usage: dict[str, Any] = response.json()["usage"]
    return usage


def expected_hit(prompt_tokens: int) -> int:
    """Whole blocks below the last prompt token: the last token is always recomputed."""
    return (prompt_tokens - 1) // CPU_BLOCK_SIZE * CPU_BLOCK_SIZE


def metric_samples(client: httpx.Client) -> dict[str, float]:
    """Sample name -> value, summed over label sets (one engine here)."""
    response = client.get("/metrics")
    response.raise_for_status()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def wait_for_metrics(
    client: httpx.Client, wanted: dict[str, float], within_s: float = 15.0
) -> dict[str, float]:
    """Counters are recorded by the engine's output loop, possibly just after the response is sent."""
    deadline = time.monotonic() + within_s
    while True:
        samples = metric_samples(client)
        reached = all(samples.get(name, 0.0) >= value for name, value in wanted.items())
        if reached or time.monotonic() > deadline:
            return samples
        time.sleep(0.2)


def test_a_repeated_long_prompt_is_served_from_whole_cached_blocks(
    vllm_server: VllmServer, client: httpx.Client
) -> None:
    prompt = unique_prompt(1000)

    first = complete(client, vllm_server, prompt)
    second = complete(client, vllm_server, prompt)

    assert first["prompt_tokens"] == 1000  # byte tokenizer, nothing added: one token per ASCII byte
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached == expected_hit(1000) == 896
    assert cached % CPU_BLOCK_SIZE == 0


def test_a_changed_first_byte_shares_no_cached_block(vllm_server: VllmServer, client: httpx.Client) -> None:
    prompt = unique_prompt(600)
    complete(client, vllm_server, prompt)
    changed = ("b" if prompt[0] == "a" else "a") + prompt[1:]

    assert complete(client, vllm_server, changed)["prompt_tokens_details"]["cached_tokens"] == 0
    repeat = complete(client, vllm_server, prompt)
    assert repeat["prompt_tokens_details"]["cached_tokens"] == expected_hit(600)


def test_tokenize_with_chat_messages_renders_the_chatml_template(
    vllm_server: VllmServer, client: httpx.Client
) -> None:
    messages = [
        {"role": "system", "content": "You triage tickets."},
        {"role": "user", "content": "Ticket 42: printer on fire."},
    ]
    rendered = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    rendered += "<|im_start|>assistant\n"
    assert "add_generation_prompt" in CHATML_TEMPLATE  # the rendering above mirrors the model's template

    chat = client.post("/tokenize", json={"model": vllm_server.served_model_name, "messages": messages})
    text = client.post("/tokenize", json={"model": vllm_server.served_model_name, "prompt": rendered})

    assert chat.status_code == 200, chat.text
    assert text.status_code == 200, text.text
    body = chat.json()
    assert body["tokens"] == text.json()["tokens"]
    assert body["count"] == len(body["tokens"])
    assert body["max_model_len"] == vllm_server.max_model_len
    # 4 specials per message pair (<|im_start|>, <|im_end|>) + the generation prompt's <|im_start|>;
    # every other character is one byte token.
    specials = 2 * len(messages) + 1
    plain = rendered
    for special in ("<|im_start|>", "<|im_end|>"):
        plain = plain.replace(special, "")
    assert body["count"] == specials + len(plain.encode())


def test_metrics_count_prefix_cache_queries_and_hits_in_tokens(
    vllm_server: VllmServer, client: httpx.Client
) -> None:
    before = metric_samples(client)
    prompt = unique_prompt(700)
    complete(client, vllm_server, prompt)
    cached = complete(client, vllm_server, prompt)["prompt_tokens_details"]["cached_tokens"]

    queries, hits = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
    after = wait_for_metrics(client, {queries: before[queries] + 1400, hits: before[hits] + cached})

    assert cached == expected_hit(700)
    assert after[queries] - before[queries] == 1400
    assert after[hits] - before[hits] == cached
    assert after["process_start_time_seconds"] == before["process_start_time_seconds"]


def test_restart_gives_a_new_process_start_time_and_a_cold_cache(vllm_restartable: VllmServer) -> None:
    server = vllm_restartable
    prompt = unique_prompt(400)
    with httpx.Client(base_url=server.base_url, timeout=120.0) as http:
        complete(http, server, prompt)
        assert complete(http, server, prompt)["prompt_tokens_details"]["cached_tokens"] == expected_hit(400)
        epoch_before = metric_samples(http)["process_start_time_seconds"]
        pid_before = server.pid
        wall_before_restart = time.time()

        server.restart()

        epoch_after = metric_samples(http)["process_start_time_seconds"]
        assert server.pid is not None
        assert server.pid != pid_before
        assert epoch_after > epoch_before
        assert epoch_after >= wall_before_restart - 1.0  # an epoch in Unix seconds (0.01 s resolution)
        assert complete(http, server, prompt)["prompt_tokens_details"]["cached_tokens"] == 0
