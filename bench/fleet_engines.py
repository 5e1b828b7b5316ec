"""The fleet bench's vLLM shape (`python -m bench.fleet --engine vllm`): what differs from llama-server boxes.

Boxes: real vLLM CPU servers (testbed/vllm_fleet.py) on the tiny HF model (testbed/tiny_hf_model.py: a
2-layer, 128-wide random Llama; one token per byte, the ChatML control tokens as single tokens, no BOS),
`--max-model-len 4096` (the model's positions), prefix caching and `--enable-prompt-tokens-details` on,
one compute thread each. The KV pool is pinned with `--num-gpu-blocks-override` in blocks of
`--block-size 32` (vLLM's CPU attention takes multiples of 32, vllm/v1/attention/backends/cpu_attn.py
`get_supported_kernel_block_sizes`; the CPU default, 128, would round a ~2,800-token stable prefix down by
up to 127 tokens and push turn 1 under the 90% hit line on block edges alone):

- tight, 200 blocks = 6,400 tokens: two idle stable prefixes of ~2,850-2,940 tokens (90-92 blocks each
  with `--prompt-tokens 3000`) fit, three do not; a running call holds its own prompt's ~96-105 blocks, so
  a busy box keeps its call's prefix and at most one more. 3 boxes hold 6 prefixes, the default shape's
  agents, as 3 llama-server boxes x 2 slots do. (192 blocks, the first choice, also hold two in the engine,
  but warmer's prefix budget keeps 5% of the pool as headroom, 5,836 tokens, less than two of the larger
  prefixes: warmer then placed one agent a box where the engine held two.)
- roomy, 640 blocks = 20,480 tokens: six idle prefixes, every agent of the default shape on every box.

Prompt sizes: `--prompt-tokens 3000` (the llama.cpp shape's) fits 4,096: a 4-turn call grows to ~3,300
tokens plus its reply. The 2,048 of models/tiny-vllm-cpu.toml does not fit a prompt whose turn 1 can hit:
turn 1 = stable prefix S + a ~170-token per-call tail, and a hit needs >= 90% of it cached, so S >= ~1,800
with 32-token blocks, and such a call's fourth turn passes 2,048.

Counters (vllm/v1/metrics/loggers.py and stats.py in vllm-cpu 0.32.0; read off a running server):
`vllm:prompt_tokens_by_source_total{source="local_compute"}` is the prompt tokens the engine computed
(`PrefillStats.num_computed_tokens` = prompt minus cached) and `vllm:prompt_tokens_cached_total` those it
reused, one series per engine (`engine` label), summed. A turn's cached tokens are
`usage.prompt_tokens_details.cached_tokens` of the final stream chunk (`stream_options.include_usage`), a
whole number of blocks; no `id_slot` (vLLM has no slots; warmer answers no slot for these boxes).

Warmer: the generated profile (`vllm_profile_toml`) is models/tiny-vllm-cpu.toml's with this shape's
context and block, plus the model's own `tokenizer.json` and ChatML template, so `warmer serve` computes
each agent's stable prefix offline with exactly the ids vLLM makes of the rendered text (the bench renders
its turns with the same profile).
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.fleet_policies import Wire
from warmer.core.promtext import parse_prometheus_text, sum_samples

VLLM_PROFILE = "tiny-vllm-cpu"  # the same name as models/tiny-vllm-cpu.toml: this is that profile, resized
VLLM_BLOCK_TOKENS = 32
VLLM_MAX_MODEL_LEN = 4096
VLLM_SETTINGS = {"tight": 200, "roomy": 640}  # --num-gpu-blocks-override per box
VLLM_SLOTS = 4  # concurrent sequences warmer assumes per box (the profile's `slots`)

COMPUTED_SERIES = "vllm:prompt_tokens_by_source_total"
COMPUTED_SOURCE = "local_compute"
CACHED_SERIES = "vllm:prompt_tokens_cached_total"

# The tiny HF model's vocabulary (testbed/tiny_hf_model.py): ids 0-255 are the bytes, then <s>, </s>,
# <|im_start|>, <|im_end|>. Banning every non-printable byte and every special keeps replies plain ASCII of
# exactly `max_tokens` tokens (no end token), which re-tokenize to the same ids in the next turn's prompt.
VLLM_SPECIAL_IDS = (256, 257, 258, 259)


def vllm_logit_bias() -> dict[str, float]:
    banned = [b for b in range(256) if not (32 <= b < 127 or b == 10)] + list(VLLM_SPECIAL_IDS)
    return {str(token): -100.0 for token in banned}


VLLM_WIRE = Wire(engine="vllm", logit_bias=vllm_logit_bias(), stream_usage=True, timings=False)


def vllm_prompt_counters(metrics_text: str) -> tuple[float, float] | None:
    """(computed, cached) prompt tokens from a vLLM server's /metrics, summed over its engines; None when
    either series is absent (not a vLLM, or a version without them)."""
    samples = parse_prometheus_text(metrics_text)
    computed = [
        s.value for s in samples if s.name == COMPUTED_SERIES and s.label("source") == COMPUTED_SOURCE
    ]
    cached = sum_samples(samples, CACHED_SERIES)
    if not computed or cached is None:
        return None
    return sum(computed), cached


def pool_tokens(setting: str) -> int:
    return VLLM_SETTINGS[setting] * VLLM_BLOCK_TOKENS


def prompts_per_pool(setting: str, stable_tokens: int) -> int:
    """How many idle stable prefixes of `stable_tokens` one box's pool holds (whole blocks each)."""
    blocks = -(-stable_tokens // VLLM_BLOCK_TOKENS)
    return VLLM_SETTINGS[setting] // blocks


def cacheable_tokens(stable_tokens: int, block_tokens: int) -> int:
    """The part of a stable prefix a block cache can hand back: its whole blocks (a partial last block is
    recomputed on every hit), what turn 1 can find cached at best."""
    return stable_tokens - stable_tokens % block_tokens


def vllm_profile_toml(tokenizer_file: Path, chat_template: str) -> str:
    """models/tiny-vllm-cpu.toml for this shape's boxes: context 4,096, blocks of 32, and what warmer needs
    to compute prefixes offline (the model's tokenizer.json, its ChatML template, its end token)."""
    return f"""# Written by bench/fleet_engines.py: models/tiny-vllm-cpu.toml for the fleet bench vLLM boxes.
engine = "vllm"
served_model_name = "tiny"
running_state = false
warm_requests_per_prefix = 1
slots = {VLLM_SLOTS}
context_length = {VLLM_MAX_MODEL_LEN}
block_tokens = {VLLM_BLOCK_TOKENS}
keepalive_seconds = 240.0
bos_token = "<s>"
eos_token = "<|im_end|>"
tokenizer_file = {json.dumps(str(tokenizer_file))}
chat_template = {json.dumps(chat_template)}

[restart]
burst_levels = [1, 4]
burst_max_tokens = 4
long_prefill_tokens = 0
long_prefill_margin_tokens = 64

[restart.sampled]
prompt = "Say hello."
max_tokens = 8
temperature = 0.7

[restart.constrained]
prompt = "Reply with a JSON object."
max_tokens = 16
json_schema = {{ type = "object", properties = {{ ok = {{ type = "boolean" }} }}, required = ["ok"] }}
"""


def write_vllm_profile(models_dir: Path, hf_model_dir: Path) -> Path:
    """The profile file in `models_dir` (warmer's and the bench's), from the served model's own files."""
    config = json.loads((hf_model_dir / "tokenizer_config.json").read_text())
    models_dir.mkdir(parents=True, exist_ok=True)
    path = models_dir / f"{VLLM_PROFILE}.toml"
    path.write_text(vllm_profile_toml(hf_model_dir / "tokenizer.json", config["chat_template"]))
    return path
