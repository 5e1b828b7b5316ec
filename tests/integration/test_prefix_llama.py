"""The computed stable prefix, proven on a real llama-server box with the generated tiny-demo model.

Offline rendering (the profile's ChatML template) and tokenizing (models/tiny-demo.tokenizer.json) must
agree with the engine's own `/apply-template` and `/tokenize`; then the prefix from `warmer render`, sent
as a warm request, is reused by a real turn-1 request of the agent with fresh per-call values.

llama.cpp server fields (ggml-org/llama.cpp `tools/server/README.md`, `server-task.cpp`): `/completion`
takes `prompt` as text or a token-id list and reports `timings.cache_n` (prompt tokens reused) and
`timings.prompt_n` (computed); `/v1/chat/completions` reports `usage.prompt_tokens_details.cached_tokens`;
`/tokenize` takes `content` + `add_special` (BOS, default false); `/apply-template` takes `messages`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from testbed.fleet import LlamaBox, LlamaFleet
from warmer.cli.prompts import render_command
from warmer.config.agents import load_agent_specs
from warmer.config.profiles import load_profile
from warmer.config.tokenizer import offline_renderer, offline_tokenizer
from warmer.core.agent_requests import build_request, sample_values
from warmer.core.agents import AgentSpec
from warmer.core.prefix import StablePrefix, compute_stable_prefix

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
AGENTS_DIR = REPO / "config" / "agents"
MODELS_DIR = REPO / "models"

FleetFactory = Callable[..., LlamaFleet]
FRESH_CALL = 6  # a sample index the stable-prefix computation never rendered (it uses 0..2)


def _post(box: LlamaBox, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{box.base_url}{path}", json=body, timeout=300.0)
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


def _stable(agent: AgentSpec) -> StablePrefix:
    profile = load_profile(MODELS_DIR / "tiny-demo.toml")
    return compute_stable_prefix(agent, offline_renderer(profile), offline_tokenizer(profile))


def _chat_messages(agent: AgentSpec, call: int) -> list[dict[str, object]]:
    # No tools in the request: the tiny model's ChatML template does not render them, and llama-server
    # would otherwise add its own tool text to the system message when a template lacks tool support.
    return [dict(m) for m in build_request(agent, sample_values(agent, call)).messages]


def test_offline_render_and_tokens_match_the_engine(llama_fleet_factory: FleetFactory) -> None:
    (box,) = llama_fleet_factory(1).boxes
    agent = load_agent_specs(AGENTS_DIR)["outbound-sales"]
    profile = load_profile(MODELS_DIR / "tiny-demo.toml")
    render, tokenize = offline_renderer(profile), offline_tokenizer(profile)

    messages = _chat_messages(agent, FRESH_CALL)
    engine_text = _post(box, "/apply-template", {"messages": messages})["prompt"]
    assert engine_text == render(messages, ())
    engine_ids = _post(box, "/tokenize", {"content": engine_text, "add_special": True})["tokens"]
    assert engine_ids == tokenize(engine_text)


def test_warmed_render_prefix_is_reused_by_a_real_turn1_request(llama_fleet_factory: FleetFactory) -> None:
    (box,) = llama_fleet_factory(1, slots=1, ctx_per_slot=4096).boxes
    rendered = CliRunner().invoke(
        render_command,
        [
            "outbound-sales",
            "--agents-dir",
            str(AGENTS_DIR),
            "--models-dir",
            str(MODELS_DIR),
            "--format",
            "json",
        ],
    )
    assert rendered.exit_code == 0, rendered.output
    warm = json.loads(rendered.output)
    assert warm["token_count"] > 3000

    warmed = _post(box, "/completion", {"prompt": warm["token_ids"], "n_predict": 1, "cache_prompt": True})
    assert warmed["timings"]["prompt_n"] >= warm["token_count"] - 1  # it really was cold

    agent = load_agent_specs(AGENTS_DIR)["outbound-sales"]
    turn1 = _post(
        box,
        "/v1/chat/completions",
        {"messages": _chat_messages(agent, FRESH_CALL), "max_tokens": 1, "temperature": 0},
    )
    cached = turn1["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= warm["token_count"] - 1
    profile = load_profile(MODELS_DIR / "tiny-demo.toml")
    this_call = _chat_messages(agent, FRESH_CALL)
    assert turn1["usage"]["prompt_tokens"] == len(
        offline_tokenizer(profile)(offline_renderer(profile)(this_call, ()))
    )


def test_early_layout_warms_almost_nothing(llama_fleet_factory: FleetFactory) -> None:
    (box,) = llama_fleet_factory(1, slots=1, ctx_per_slot=4096).boxes
    agent = load_agent_specs(AGENTS_DIR)["outbound-sales-early"]
    stable = _stable(agent)
    profile = load_profile(MODELS_DIR / "tiny-demo.toml")
    render = offline_renderer(profile)

    first_call = build_request(agent, sample_values(agent, 0))
    _post(
        box, "/completion", {"prompt": render(first_call.messages, ()), "n_predict": 1, "cache_prompt": True}
    )
    second_call = build_request(agent, sample_values(agent, FRESH_CALL))
    turn1 = _post(
        box, "/completion", {"prompt": render(second_call.messages, ()), "n_predict": 1, "cache_prompt": True}
    )

    # The whole previous call is in the slot, yet only the prefix before `{now}` is reusable.
    assert stable.token_count - 1 <= turn1["timings"]["cache_n"] <= stable.token_count
    assert turn1["timings"]["prompt_n"] > 3000
