"""How an agent spec becomes a chat request: realistic sample values, then the request for given values.

Sample values are deterministic per call number and, per placeholder, start with different characters, so
the stable prefix computed from several samples ends exactly where the per-call part begins.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

# `{identifier}` is a placeholder; `{{identifier}}` is the escape for literal braces. JSON such as
# `{"a": 1}` never matches, so reference material and examples may hold JSON freely.
from warmer.core.agents import (
    AgentSpec,
    FewShotMessage,
    Placeholder,
    StaticBlock,
    placeholder_sites,
    placeholders_in,
    substitute,
    substitute_tree,
)

# Eight values per kind whose first characters all differ (see `sample_value`).
_NAMES = (
    "Ana Souza",
    "Bilal Khan",
    "Chen Wei",
    "Dana Levi",
    "Emeka Obi",
    "Farah Aziz",
    "Gita Rao",
    "Hugo Lenz",
)
_DAYS = (3, 14, 25, 6, 7, 8, 9, 5)
_MONTHS = ("March", "July", "May", "June", "April", "August", "January", "October")
_TIMES = ("09:15", "10:40", "21:05", "4:30 pm", "5:45 pm", "6:20 pm", "7:10 am", "8:55 am")
_PHONES = (
    "+1 212 555 0147",
    "020 7946 0018",
    "(415) 555-0199",
    "98765 43210",
    "555-0123",
    "61 2 9374 4000",
    "7911 123456",
    "8 800 555 35 35",
)


def sample_value(placeholder: Placeholder, index: int) -> str:
    """A deterministic, realistic sample for call number `index`.

    Values for different indexes start with different characters, so the computed common prefix of two
    samples ends where the value begins (never a few characters into it).
    """
    if placeholder.samples:
        return placeholder.samples[index % len(placeholder.samples)]
    i = index % 8
    kind = placeholder.kind
    if kind == "name":
        return _NAMES[i]
    if kind == "datetime":
        return f"{_DAYS[i]} {_MONTHS[i]} 2026, {_TIMES[i]}"
    if kind == "date":
        return f"{_DAYS[i]} {_MONTHS[i]} 2026"
    if kind == "time":
        return _TIMES[i]
    if kind == "uuid":
        return _uuid(i)
    if kind == "id":
        return f"{'ABCDEFGH'[i]}{7310 + i * 137}"
    if kind == "phone":
        return _PHONES[i]
    if kind == "number":
        return str(i + 1) * (1 + i % 2)
    if kind == "amount":
        return f"{i + 1}{i}.{i}9"
    return f"{'abcdefgh'[i]}-sample-{i}"


def _uuid(i: int) -> str:
    """A UUID whose first hex digit differs per index."""
    digits = "0123456789abcdef"
    base = hashlib.sha256(f"warmer-sample-{i}".encode()).hexdigest()
    return str(uuid.UUID(digits[i] + base[1:32]))


def sample_values(spec: AgentSpec, index: int) -> dict[str, str]:
    return {p.name: sample_value(p, index) for p in spec.placeholders}


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """The chat-level form of one call's turn-1 request: what a client sends before the template runs."""

    messages: tuple[Mapping[str, object], ...]
    tools: tuple[Mapping[str, object], ...] = field(default_factory=tuple)


def build_request(spec: AgentSpec, values: Mapping[str, str]) -> ChatRequest:
    """Turn-1 request for one call: [system: static blocks] + few-shot + [tail message], tools.

    The convention: every per-call value is rendered into the LAST part of the prompt. With the default
    `placement="message"` that is a final message of its own after the few-shot messages, so nothing a
    template derives from the static part (tool definitions included) can come after it.
    """
    system = substitute(spec.system_text, values)
    tail = substitute(spec.tail.template, values)
    messages: list[Mapping[str, object]] = []
    if spec.tail.placement == "system_end":
        messages.append({"role": "system", "content": system + spec.block_separator + tail})
        messages += [{"role": m.role, "content": substitute(m.content, values)} for m in spec.few_shot]
    else:
        messages.append({"role": "system", "content": system})
        messages += [{"role": m.role, "content": substitute(m.content, values)} for m in spec.few_shot]
        messages.append({"role": spec.tail.role, "content": tail})
    tools: list[Mapping[str, object]] = []
    for tool in spec.tools:
        rendered = substitute_tree(tool, values)
        assert isinstance(rendered, Mapping)
        tools.append(rendered)
    return ChatRequest(tuple(messages), tuple(tools))


def with_values_frozen_in_static(spec: AgentSpec, values: Mapping[str, str]) -> AgentSpec:
    """The same spec with per-call values inside static text replaced by constants.

    Its stable prefix is what the agent would get if those values were moved to the tail: the "ideal"
    that lint compares against.
    """
    static_names = {s.placeholder for s in placeholder_sites(spec) if s.section != "tail"}
    frozen = {k: v for k, v in values.items() if k in static_names}
    tail_names = {n for n, _, _ in placeholders_in(spec.tail.template)}
    tools: list[Mapping[str, object]] = []
    for tool in spec.tools:
        frozen_tool = substitute_tree(tool, frozen, unescape=False)
        assert isinstance(frozen_tool, Mapping)
        tools.append(frozen_tool)
    return AgentSpec(
        id=spec.id,
        model=spec.model,
        blocks=tuple(
            StaticBlock(b.name, substitute(b.text, frozen, unescape=False), b.source) for b in spec.blocks
        ),
        tail=spec.tail,
        placeholders=tuple(
            p for p in spec.placeholders if p.name not in static_names or p.name in tail_names
        ),
        tools=tuple(tools),
        few_shot=tuple(
            FewShotMessage(m.role, substitute(m.content, frozen, unescape=False)) for m in spec.few_shot
        ),
        block_separator=spec.block_separator,
        source=spec.source,
    )
