"""Render a model's chat template locally, the way Hugging Face `apply_chat_template` does.

Used when the engine cannot render for us (no `/apply-template`, no chat `/tokenize`). Mirrors
transformers' `_compile_jinja_template` / `render_jinja_template` (transformers/utils/chat_template_utils.py):
an immutable sandboxed jinja2 environment with `trim_blocks` and `lstrip_blocks`, the `loopcontrols`
extension, a `tojson` filter that keeps non-ASCII text (`ensure_ascii=False`) and accepts `indent`, and the
`raise_exception` / `strftime_now` globals; `tools` is None when there are none.

Pure: the template source and special tokens are passed in; `strftime_now` reads the clock only if a
template calls it (and a template that puts the current time in the prompt is itself a per-call value).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import NoReturn

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from warmer.core.errors import ConfigError


class ChatTemplateError(ConfigError):
    """The template failed to compile or raised while rendering (e.g. `raise_exception`)."""

    def __init__(self, message: str) -> None:
        super().__init__([("chat_template", message)])


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


def _tojson(
    value: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now(tz=UTC).strftime(fmt)


class ChatTemplate:
    """A compiled chat template; call it like the `render` seam: `template(messages, tools) -> str`."""

    def __init__(
        self,
        source: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        add_generation_prompt: bool = True,
        extra_context: Mapping[str, object] | None = None,
    ) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            raise ChatTemplateError(f"does not compile: {exc}") from exc
        self._context: dict[str, object] = {
            "bos_token": bos_token,
            "eos_token": eos_token,
            "add_generation_prompt": add_generation_prompt,
            **(extra_context or {}),
        }

    def __call__(
        self, messages: Sequence[Mapping[str, object]], tools: Sequence[Mapping[str, object]]
    ) -> str:
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                tools=[dict(t) for t in tools] or None,
                **self._context,
            )
        except TemplateError as exc:
            raise ChatTemplateError(f"raised while rendering: {exc}") from exc
