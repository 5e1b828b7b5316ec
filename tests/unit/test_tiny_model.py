"""The generated test model is reproducible and carries the vocabulary and template the bench relies on."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf
import pytest

from testbed.tiny_model import (
    BOS_ID,
    CHATML_TEMPLATE,
    IM_END_ID,
    IM_START_ID,
    VOCAB_SIZE,
    TinyModelError,
    byte_token_id,
    write_tiny_model,
)

SMALL = {"layers": 1, "width": 64, "context": 256}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_gives_identical_bytes_and_another_seed_does_not(tmp_path: Path) -> None:
    first, second, other = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    write_tiny_model(first, seed=7, **SMALL)
    write_tiny_model(second, seed=7, **SMALL)
    write_tiny_model(other, seed=8, **SMALL)
    assert _digest(first) == _digest(second)
    assert _digest(first) != _digest(other)


def test_vocabulary_is_bytes_plus_chatml_specials(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    write_tiny_model(path, **SMALL)
    reader = gguf.GGUFReader(str(path))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    assert len(tokens) == VOCAB_SIZE
    assert tokens[byte_token_id(0x00)] == "<0x00>"
    assert tokens[byte_token_id(0xFF)] == "<0xFF>"
    assert all(types[byte_token_id(b)] == gguf.TokenType.BYTE for b in range(256))
    assert (tokens[IM_START_ID], tokens[IM_END_ID]) == ("<|im_start|>", "<|im_end|>")
    assert types[IM_START_ID] == types[IM_END_ID] == gguf.TokenType.CONTROL
    assert reader.fields["tokenizer.ggml.model"].contents() == "llama"
    assert reader.fields["tokenizer.ggml.bos_token_id"].contents() == BOS_ID
    assert reader.fields["tokenizer.ggml.add_bos_token"].contents() is True
    assert reader.fields["tokenizer.chat_template"].contents() == CHATML_TEMPLATE


def test_width_not_a_multiple_of_the_head_size_is_rejected_by_name(tmp_path: Path) -> None:
    with pytest.raises(TinyModelError, match="width"):
        write_tiny_model(tmp_path / "bad.gguf", layers=1, width=100, context=256)
    assert not (tmp_path / "bad.gguf").exists()
