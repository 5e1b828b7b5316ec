"""Shared builders for the prompt tests: the tiny-demo renderer/tokenizer and a BPE-like word tokenizer."""

from __future__ import annotations

import re
import zlib
from pathlib import Path

from testbed.tiny_model import CHATML_TEMPLATE
from warmer.config.tokenizer import FileTokenizer, byte_spm_tokenizer
from warmer.core.agents import AgentSpec, DynamicTail, Placeholder, StaticBlock, placeholders_in
from warmer.core.chat_template import ChatTemplate

REPO = Path(__file__).resolve().parents[2]
AGENTS_DIR = REPO / "config" / "agents"
MODELS_DIR = REPO / "models"

_KINDS = {"customer_name": "name", "now": "datetime", "call_id": "uuid", "phone": "phone"}

chatml = ChatTemplate(CHATML_TEMPLATE)
byte_tokenize = FileTokenizer(byte_spm_tokenizer())

# GPT-2-style pre-tokenization: a space is glued to the FOLLOWING word (" Ana"), like most BPE vocabularies.
_WORD_RE = re.compile(r" ?[A-Za-z]+| ?\d+| ?[^\sA-Za-z\d]|\s")


def word_tokenize(text: str) -> list[int]:
    """Deterministic ids per piece; "Hello Ana" -> ["Hello", " Ana"], so the space belongs to the value."""
    return [zlib.crc32(piece.encode()) for piece in _WORD_RE.findall(text)]


def spec(
    *,
    agent_id: str = "agent",
    blocks: tuple[tuple[str, str], ...] = (("persona", "You are Maya.\nBe kind."),),
    tail: str = "Customer: {customer_name}\nNow: {now}",
    placeholders: tuple[Placeholder, ...] | None = None,
    tools: tuple[dict[str, object], ...] = (),
    placement: str = "message",
) -> AgentSpec:
    if placeholders is None:  # declare exactly the placeholders used, with a fitting sample kind
        used = {n for _, text in blocks for n, _, _ in placeholders_in(text)} | {
            n for n, _, _ in placeholders_in(tail)
        }
        placeholders = tuple(Placeholder(n, _KINDS.get(n, "text")) for n in sorted(used))
    return AgentSpec(
        id=agent_id,
        model="tiny-demo",
        blocks=tuple(StaticBlock(name, text) for name, text in blocks),
        tail=DynamicTail(tail, "user", placement),  # type: ignore[arg-type]
        placeholders=placeholders,
        tools=tools,
    )


def tool(name: str, description: str = "Does a thing.") -> dict[str, object]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
        },
    }
