"""Offline rendering and tokenizing for a model profile: its chat template + its `tokenizers` file.

The fallback when no engine is asked (`warmer render/lint` without `--engine-url`). The file loading
lives here (config may do I/O); the core gets plain callables.

`byte_spm_tokenizer` builds the `tokenizers` equivalent of the generated tiny-demo GGUF vocabulary
(testbed/tiny_model.py): `<unk> <s> </s>`, the 256 byte tokens, then the ChatML control tokens; no merges,
so every byte is one token. It reproduces llama.cpp's SPM tokenization of that vocabulary: BOS first, a
space prefix at the start AND after every special token, each space written as U+2581 (3 bytes = 3 tokens).
See llama.cpp src/llama-vocab.cpp, `tokenize_impl`, LLAMA_VOCAB_TYPE_SPM: "prefix with space if previous is
special" (`is_prev_special`), and `llama_escape_whitespace`. The server tokenizes prompts with special-token
parsing on, so `<|im_start|>` in the rendered text is one token.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from warmer.core.chat_template import ChatTemplate
from warmer.core.errors import ConfigError
from warmer.core.hosted import render_request
from warmer.core.model import ModelProfile
from warmer.core.prefix import RenderFn, TokenizeFn

SPM_SPACE = "\u2581"


class FileTokenizer:
    """`TokenizeFn` over a `tokenizers` Tokenizer: ids with the model's special tokens (BOS) added."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=True).ids)


def load_tokenizer(path: Path) -> TokenizeFn:
    """A tokenizer from a `tokenizer.json` file (the Hugging Face `tokenizers` format)."""
    try:
        return FileTokenizer(Tokenizer.from_file(str(path)))
    except Exception as exc:  # tokenizers raises a bare Exception for missing or malformed files
        raise ConfigError([("tokenizer_file", f"cannot load {path}: {exc}")]) from None


def offline_renderer(profile: ModelProfile) -> RenderFn:
    """The profile's chat template, rendered like `apply_chat_template(..., add_generation_prompt=True)`; a
    hosted model's request form (`warmer.core.hosted.render_request`), whose whole lines the box warms."""
    if profile.engine.hosted:
        return render_request
    if not profile.chat_template:
        raise ConfigError(
            [(f"profiles.{profile.name}.chat_template", "needed to render offline (or use an engine)")]
        )
    return ChatTemplate(profile.chat_template, bos_token=profile.bos_token, eos_token=profile.eos_token)


def offline_tokenizer(profile: ModelProfile) -> TokenizeFn:
    if not profile.tokenizer_file:
        raise ConfigError(
            [(f"profiles.{profile.name}.tokenizer_file", "needed to tokenize offline (or use an engine)")]
        )
    return load_tokenizer(Path(profile.tokenizer_file))


def offline_engine_version(profile: ModelProfile) -> str:
    """What computed an offline prefix, as recorded next to its token count (the drift history):
    `offline:<profile>:<tokenizer file name>@<sha256 of its bytes, 12 hex>`. The digest, not the name,
    is what changes when a model update ships a different tokenizer under the same file name, and that
    is exactly when the same prefix text may start tokenizing to another count."""
    if not profile.tokenizer_file:
        raise ConfigError(
            [(f"profiles.{profile.name}.tokenizer_file", "needed to tokenize offline (or use an engine)")]
        )
    path = Path(profile.tokenizer_file)
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    except OSError as exc:
        raise ConfigError(
            [(f"profiles.{profile.name}.tokenizer_file", f"cannot read {path}: {exc}")]
        ) from None
    return f"offline:{profile.name}:{path.name}@{digest}"


def byte_spm_tokenizer(specials_after_bytes: Sequence[str] = ("<|im_start|>", "<|im_end|>")) -> Tokenizer:
    """The tiny-demo vocabulary as a `tokenizers` model (ids: unk 0, BOS 1, EOS 2, bytes 3.., specials)."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for offset, token in enumerate(specials_after_bytes):
        vocab[token] = 259 + offset
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))  # noqa: S106
    # "always": a space prefix on every piece of text between special tokens, as llama.cpp does.
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=SPM_SPACE, prepend_scheme="always", split=False
    )
    tokenizer.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t in ["<unk>", "<s>", "</s>", *specials_after_bytes]
        ]
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)]
    )
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace(SPM_SPACE, " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return tokenizer
