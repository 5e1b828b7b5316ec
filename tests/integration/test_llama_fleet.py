"""Real llama-server boxes from the fleet fixture: prefix-cache hits and misses as the server reports them.

Field names, from llama.cpp `tools/server/server-task.cpp` (ggml-org/llama.cpp):
- POST /completion -> `timings.cache_n` (prompt tokens reused from the cache) and `timings.prompt_n`
  (prompt tokens computed), from `result_timings::to_json`.
- POST /v1/completions -> `usage.prompt_tokens_details.cached_tokens` (= the same `n_prompt_tokens_cache`),
  from `server_task_result_cmpl_final::usage_json_oaicompat`.
- `tokens_cached` is documented in `tools/server/README.md` as the tokens the slot holds after the request
  (`n_past`), so it is non-zero even on a full miss: it must not be read as a hit indicator.
- POST /tokenize takes `content` and `add_special` (BOS; default false), `tools/server/README.md`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from testbed.fleet import LlamaBox, LlamaFleet, pids_alive
from testbed.tiny_model import BOS_ID, IM_START_ID, byte_token_id

pytestmark = pytest.mark.integration

FleetFactory = Callable[..., LlamaFleet]

# ~1,200 bytes of plain ASCII: one token per byte on the tiny model, so about 1,300 prompt tokens.
PREFIX = "".join(f"Agent rule {i}: answer briefly and cite the ticket id. " for i in range(24))

# SPM writes the leading space prefix (and every space) as U+2581, 3 UTF-8 bytes = 3 byte tokens.
SPACE_MARK = [byte_token_id(b) for b in "\u2581".encode()]


def _post(box: LlamaBox, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{box.base_url}{path}", json=body, timeout=120.0)
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


def _prompt_tokens(box: LlamaBox, text: str) -> int:
    """Prompt length as /completion sees it: with BOS."""
    return len(_post(box, "/tokenize", {"content": text, "add_special": True})["tokens"])


def _complete(box: LlamaBox, prompt: str) -> dict[str, Any]:
    return _post(box, "/completion", {"prompt": prompt, "n_predict": 1, "cache_prompt": True})


def test_tiny_model_tokenizes_bytes_and_renders_chatml(llama_fleet_factory: FleetFactory) -> None:
    (box,) = llama_fleet_factory(1).boxes

    plain = _post(box, "/tokenize", {"content": "Hi!"})["tokens"]
    assert plain == [*SPACE_MARK, *(byte_token_id(b) for b in b"Hi!")]
    two_words = _post(box, "/tokenize", {"content": "a b"})["tokens"]
    assert two_words == [*SPACE_MARK, byte_token_id(ord("a")), *SPACE_MARK, byte_token_id(ord("b"))]
    with_bos = _post(box, "/tokenize", {"content": "Hi!", "add_special": True})["tokens"]
    assert with_bos == [BOS_ID, *plain]
    control = _post(box, "/tokenize", {"content": "<|im_start|>"})["tokens"]
    assert IM_START_ID in control

    rendered = _post(
        box,
        "/apply-template",
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
    )["prompt"]
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_cache_hits_are_per_box_and_a_restart_empties_the_cache(llama_fleet_factory: FleetFactory) -> None:
    fleet = llama_fleet_factory(2)
    first, second = fleet.boxes
    assert first.port != second.port
    prompt_len = _prompt_tokens(first, PREFIX)
    assert prompt_len > len(PREFIX)  # BOS + the SPM space marks: every byte really is a token

    cold = _complete(first, PREFIX)
    assert cold["timings"]["cache_n"] == 0
    assert cold["timings"]["prompt_n"] == prompt_len
    # `tokens_cached` is what the slot holds afterwards: non-zero on a full miss, so never a hit signal.
    assert cold["tokens_cached"] >= prompt_len

    warm = _complete(first, PREFIX)
    # A full hit still recomputes the last prompt token to get fresh logits.
    assert warm["timings"]["cache_n"] == prompt_len - 1
    assert warm["timings"]["prompt_n"] == 1

    openai_warm = _post(first, "/v1/completions", {"prompt": PREFIX, "max_tokens": 1})
    assert openai_warm["usage"]["prompt_tokens"] == prompt_len
    assert openai_warm["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt_len - 1

    # Caches are per box: the other box has never seen this prefix.
    openai_cold = _post(second, "/v1/completions", {"prompt": PREFIX, "max_tokens": 1})
    assert openai_cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

    restarted = fleet.restart(first.id)
    assert (restarted.id, restarted.port, restarted.base_url) == (first.id, first.port, first.base_url)
    assert restarted.pid != first.pid
    assert pids_alive([first.pid]) == []
    after_restart = _complete(restarted, PREFIX)
    assert after_restart["timings"]["cache_n"] == 0
    assert after_restart["timings"]["prompt_n"] == prompt_len


def test_prompt_tokens_cached_metric_sums_cache_n(llama_fleet_factory: FleetFactory) -> None:
    (box,) = llama_fleet_factory(1).boxes
    reused = sum(_complete(box, PREFIX)["timings"]["cache_n"] for _ in range(3))
    assert reused > 0
    metrics = httpx.get(f"{box.base_url}/metrics", timeout=10.0).text
    samples = {
        line.split()[0]: float(line.split()[1])
        for line in metrics.splitlines()
        if line and not line.startswith("#")
    }
    assert samples["llamacpp:prompt_tokens_cached_total"] == reused


def test_kill_restart_and_stop_act_on_the_real_processes(llama_fleet_factory: FleetFactory) -> None:
    fleet = llama_fleet_factory(1, slots=2, ctx_per_slot=1024)
    (box,) = fleet.boxes
    assert box.slots == 2
    props = httpx.get(f"{box.base_url}/props", timeout=10.0).json()
    assert props["total_slots"] == 2
    slots = httpx.get(f"{box.base_url}/slots", timeout=10.0).json()
    assert [slot["n_ctx"] for slot in slots] == [1024, 1024]  # -c is split across the slots

    fleet.kill(box.id)
    assert not fleet.is_running(box.id)
    assert pids_alive([box.pid]) == []
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{box.base_url}/health", timeout=2.0)

    back = fleet.restart(box.id)
    assert httpx.get(f"{back.base_url}/health", timeout=10.0).status_code == 200

    fleet.stop()
    assert pids_alive([back.pid]) == []
