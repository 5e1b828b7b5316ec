"""How the simulated engines turn text into token ids: a `tokenizers` file, by default the tiny-demo model's
(models/tiny-demo.tokenizer.json, the same vocabulary warmer's tiny-demo profile counts prefixes with), so
the token counts a sim box reports agree with what warmer computes offline for that profile.

The chat routes render ChatML, the tiny-demo profile's template.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

DEFAULT_TOKENIZER = Path(__file__).resolve().parents[2] / "models" / "tiny-demo.tokenizer.json"


class SimTokenizer:
    def __init__(self, path: Path = DEFAULT_TOKENIZER) -> None:
        self.path = path
        self._tokenizer = Tokenizer.from_file(str(path))

    def encode(self, text: str, *, add_special: bool) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))


class PromptError(ValueError):
    """A request body the engine would reject (400)."""


def render_chatml(messages: Any, *, add_generation_prompt: bool = True) -> str:
    """ChatML over `messages` (the tiny-demo profile's chat template), or PromptError."""
    if not isinstance(messages, list) or not messages:
        raise PromptError("'messages' must be a non-empty list")
    parts = []
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise PromptError("each message needs a string 'role'")
        content = message.get("content")
        parts.append(
            f"<|im_start|>{message['role']}\n{content if isinstance(content, str) else ''}<|im_end|>\n"
        )
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def prompt_ids(tokenizer: SimTokenizer, prompt: Any, *, mixed: bool = False) -> list[int]:
    """Token ids of a completion prompt: text (special tokens added, as the engines do with a text prompt),
    a list of ids (used as given), or with `mixed` (llama.cpp) ids and strings in one list."""
    if isinstance(prompt, str):
        return tokenizer.encode(prompt, add_special=True)
    if isinstance(prompt, list) and prompt:
        ids: list[int] = []
        for item in prompt:
            if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
                ids.append(item)
            elif mixed and isinstance(item, str):
                ids.extend(tokenizer.encode(item, add_special=False))
            else:
                raise PromptError("'prompt' must be a string or a list of token ids")
        return ids
    raise PromptError("'prompt' must be a non-empty string or list of token ids")
