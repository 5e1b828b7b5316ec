"""Generate (once) a tiny random-weight `transformers` Llama with a byte-level tokenizer for vLLM tests.

vLLM loads Hugging Face checkpoints, not GGUF, so the vLLM bench needs its own model. It is written by
the vLLM venv's python (the project venv has no torch), cached outside the repo, and loads fully offline.

Tokenizer: one token per byte (ids 0-255, GPT-2 byte-to-unicode alphabet, no merges, no regex split),
then the specials below. Nothing is added automatically (no BOS post-processor), so a prompt of N ASCII
bytes is exactly N tokens, and a chat rendered by the ChatML template tokenizes to the same ids whether
it goes through `/tokenize` with `messages` or as plain text.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from testbed.cache import cache_root
from testbed.vllm_install import ensure_vllm

# Bump when the generated files change shape; the cache key includes it.
TINY_HF_MODEL_VERSION = 1

BYTE_TOKENS = 256
SPECIAL_TOKENS = ("<s>", "</s>", "<|im_start|>", "<|im_end|>")
BOS = "<s>"
EOS = "<|im_end|>"  # a chat turn ends here, so generation stops at it
VOCAB_SIZE = BYTE_TOKENS + len(SPECIAL_TOKENS)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Runs inside the vLLM venv: argv[1] is a JSON object of parameters, argv[2] the output directory.
_GENERATOR = r"""
import json, sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM

p = json.loads(sys.argv[1])
out = Path(sys.argv[2])

alphabet = pre_tokenizers.ByteLevel.alphabet()
# Order the 256 byte symbols by the byte they stand for, so token id == byte value.
def byte_symbols():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, (chr(c) for c in cs)))
    return [table[b] for b in range(256)]

symbols = byte_symbols()
assert sorted(symbols) == sorted(alphabet)
vocab = {s: i for i, s in enumerate(symbols)}
tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
tok.decoder = decoders.ByteLevel()
tok.add_special_tokens(p["special_tokens"])
assert tok.get_vocab_size() == p["vocab_size"], tok.get_vocab_size()
out.mkdir(parents=True, exist_ok=True)
tok.save(str(out / "tokenizer.json"))

ids = {t: tok.token_to_id(t) for t in p["special_tokens"]}
(out / "tokenizer_config.json").write_text(json.dumps({
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": p["bos_token"],
    "eos_token": p["eos_token"],
    "pad_token": p["eos_token"],
    "add_bos_token": False,
    "add_eos_token": False,
    "clean_up_tokenization_spaces": False,
    "model_max_length": p["max_positions"],
    "chat_template": p["chat_template"],
}, indent=2))
(out / "special_tokens_map.json").write_text(json.dumps({
    "bos_token": p["bos_token"], "eos_token": p["eos_token"], "pad_token": p["eos_token"],
}, indent=2))

torch.manual_seed(p["seed"])
config = LlamaConfig(
    vocab_size=p["vocab_size"],
    hidden_size=p["hidden"],
    intermediate_size=p["hidden"] * 2,
    num_hidden_layers=p["layers"],
    num_attention_heads=p["heads"],
    num_key_value_heads=p["heads"],
    head_dim=p["hidden"] // p["heads"],
    max_position_embeddings=p["max_positions"],
    bos_token_id=ids[p["bos_token"]],
    eos_token_id=ids[p["eos_token"]],
    pad_token_id=ids[p["eos_token"]],
    tie_word_embeddings=False,
    dtype="float32",
)
model = LlamaForCausalLM(config)
model.generation_config.do_sample = False
model.save_pretrained(str(out), safe_serialization=True)
print(json.dumps({"params": sum(t.numel() for t in model.parameters()), "special_ids": ids}))
"""


def _parameters(seed: int) -> dict[str, object]:
    return {
        "seed": seed,
        "vocab_size": VOCAB_SIZE,
        "special_tokens": list(SPECIAL_TOKENS),
        "bos_token": BOS,
        "eos_token": EOS,
        "chat_template": CHATML_TEMPLATE,
        "layers": 2,
        # head_dim 64: vLLM's CPU attention supports only some head sizes (64 is one of them).
        "hidden": 128,
        "heads": 2,
        "max_positions": 4096,
    }


def model_dir(seed: int = 0) -> Path:
    return cache_root() / "models" / f"tiny-hf-llama-v{TINY_HF_MODEL_VERSION}-seed{seed}"


def ensure_tiny_hf_model(seed: int = 0, *, python: Path | None = None) -> Path:
    """Return a directory vLLM can serve with `--model DIR`, generating it first if missing."""
    return generate_once(model_dir(seed), _GENERATOR, [json.dumps(_parameters(seed))], python=python)


def generate_once(target: Path, generator: str, args: list[str], *, python: Path | None = None) -> Path:
    """Run `generator` (Python source) in the vLLM venv with `args` and a scratch directory to write the
    model into, once: the scratch becomes `target`, marked done, under a lock (parallel test workers must
    not write it twice)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / f"{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".ok").exists():
            return target
        interpreter = python or ensure_vllm()
        scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            done = subprocess.run(
                [str(interpreter), "-c", generator, *args, str(scratch)],
                capture_output=True,
                text=True,
                check=False,
                env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
            )
            if done.returncode != 0:
                raise RuntimeError(f"{target.name}: model generation failed:\n{done.stderr[-4000:]}")
            (scratch / ".ok").write_text(done.stdout)
            shutil.rmtree(target, ignore_errors=True)
            scratch.rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return target


if __name__ == "__main__":
    print(ensure_tiny_hf_model())
