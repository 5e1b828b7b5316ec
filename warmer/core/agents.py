"""Agent prompt specs: the static parts every call shares, and the dynamic tail that holds per-call values.

The layout rule from the field: anything that changes per call goes at the END of the
prompt, because engines reuse cached work only up to the first token that differs. An `AgentSpec` makes
that layout explicit: ordered static blocks, tools and few-shot messages are meant to be identical on every
call; every per-call value is a declared placeholder (`{customer_name}`) that belongs in the dynamic tail.

A declared placeholder found in static text is NOT rejected: users move prompts over gradually, so it is
rendered exactly as the engine would see it (the computed stable prefix then stops there) and reported by
lint as "per-call value in static text". An *undeclared* `{name}` is a config error, because we cannot
tell whether it is a typo or a per-call value; write `{{name}}` for literal braces.

Pure: no I/O. Files named by a spec are resolved by `warmer.config.agents` before an `AgentSpec` exists.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from warmer.core.errors import ConfigError

# `{identifier}` is a placeholder; `{{identifier}}` is the escape for literal braces. JSON such as
# `{"a": 1}` never matches, so reference material and examples may hold JSON freely.
PLACEHOLDER_RE = re.compile(r"(?<!\{)\{([A-Za-z_][A-Za-z0-9_]*)\}(?!\})")
_ESCAPED_RE = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}")

SampleKind = Literal["name", "datetime", "date", "time", "uuid", "id", "phone", "number", "amount", "text"]
SAMPLE_KINDS: tuple[str, ...] = (
    "name",
    "datetime",
    "date",
    "time",
    "uuid",
    "id",
    "phone",
    "number",
    "amount",
    "text",
)
ROLES: tuple[str, ...] = ("system", "user", "assistant")
TailPlacement = Literal["message", "system_end"]


@dataclass(frozen=True, slots=True)
class StaticBlock:
    """One named piece of static prompt text (persona, rules, call flow, reference, examples)."""

    name: str
    text: str
    source: str = ""  # where the text came from (an included file), for messages only


@dataclass(frozen=True, slots=True)
class FewShotMessage:
    role: str
    content: str


@dataclass(frozen=True, slots=True)
class DynamicTail:
    """The per-call part of the prompt, rendered last.

    `placement="message"` (the default and the recommended layout) sends the rendered tail as its own
    final chat message with `role`, so it comes after everything a chat template renders from the static
    part, tools included. `"system_end"` appends it to the system text instead; it exists because that is
    what many prompts do today, and some templates render tools AFTER the system text, which makes the
    tools unreachable for the cache (lint reports it).
    """

    template: str
    role: str = "user"
    placement: TailPlacement = "message"


@dataclass(frozen=True, slots=True)
class Placeholder:
    """A declared per-call value: its name, how to generate sample values, and optional explicit samples."""

    name: str
    kind: str = "text"
    samples: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PlaceholderSite:
    """Where one placeholder occurrence sits in the spec (for advice like 'block persona line 3')."""

    placeholder: str
    section: str  # "block" | "few_shot" | "tools" | "tail"
    where: str  # block name, "few_shot[i]", "tools[i].<path>", "dynamic.template"
    line: int  # 1-based line within that text (1 for tool strings)

    def describe(self) -> str:
        if self.section == "block":
            return f"block '{self.where}' line {self.line}"
        if self.section == "tail":
            return f"the dynamic tail line {self.line}"
        return f"{self.where} line {self.line}"


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """An agent's prompt, as the config declares it. Values, not services: hash it, compare it, render it."""

    id: str
    model: str  # a ModelProfile name
    blocks: tuple[StaticBlock, ...]
    tail: DynamicTail
    placeholders: tuple[Placeholder, ...] = ()
    tools: tuple[Mapping[str, object], ...] = ()
    few_shot: tuple[FewShotMessage, ...] = ()
    block_separator: str = "\n\n"
    source: str = ""  # the spec file, for messages only (not part of the hash)

    def __post_init__(self) -> None:
        problems = validate_spec(self)
        if problems:
            raise ConfigError(problems)

    def __hash__(self) -> int:  # tool definitions are dicts: hash the canonical content instead
        return hash(self.spec_hash)

    @property
    def placeholder_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.placeholders)

    def placeholder(self, name: str) -> Placeholder:
        for p in self.placeholders:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def system_text(self) -> str:
        """The static system text, placeholders not yet substituted."""
        return self.block_separator.join(b.text for b in self.blocks)

    @property
    def spec_hash(self) -> str:
        """Stable identity of the spec's content: changes exactly when what is sent could change."""
        return spec_hash(self)

    def canonical(self) -> dict[str, object]:
        """Plain-data form with a fixed key order, used for hashing and for `render --format json`."""
        return {
            "id": self.id,
            "model": self.model,
            "blocks": [{"name": b.name, "text": b.text} for b in self.blocks],
            "block_separator": self.block_separator,
            "tools": [dict(t) for t in self.tools],
            "few_shot": [{"role": m.role, "content": m.content} for m in self.few_shot],
            "tail": {
                "template": self.tail.template,
                "role": self.tail.role,
                "placement": self.tail.placement,
            },
            "placeholders": [
                {"name": p.name, "kind": p.kind, "samples": list(p.samples)} for p in self.placeholders
            ],
        }


def spec_hash(spec: AgentSpec) -> str:
    blob = json.dumps(spec.canonical(), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def placeholders_in(text: str) -> Iterator[tuple[str, int, int]]:
    """Yield (name, 1-based line, char offset) for each placeholder occurrence in `text`."""
    for match in PLACEHOLDER_RE.finditer(text):
        yield match.group(1), text.count("\n", 0, match.start()) + 1, match.start()


def substitute(text: str, values: Mapping[str, str], *, unescape: bool = True) -> str:
    """Fill declared placeholders and (when rendering) unescape `{{name}}`; anything else stays literal."""

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        return values[name] if name in values else match.group(0)

    filled = PLACEHOLDER_RE.sub(fill, text)
    return _ESCAPED_RE.sub(r"{\1}", filled) if unescape else filled


def _tool_strings(node: object, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, str):
        yield path, node
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield from _tool_strings(value, f"{path}.{key}")
    elif isinstance(node, list | tuple):
        for i, value in enumerate(node):
            yield from _tool_strings(value, f"{path}[{i}]")


def substitute_tree(node: object, values: Mapping[str, str], *, unescape: bool = True) -> object:
    """`substitute` over every string in a JSON-like tree (tool definitions)."""
    if isinstance(node, str):
        return substitute(node, values, unescape=unescape)
    if isinstance(node, Mapping):
        return {key: substitute_tree(value, values, unescape=unescape) for key, value in node.items()}
    if isinstance(node, list | tuple):
        return [substitute_tree(value, values, unescape=unescape) for value in node]
    return node


def placeholder_sites(spec: AgentSpec) -> list[PlaceholderSite]:
    """Every placeholder occurrence in spec order (static blocks, few-shot, tools, then the tail)."""
    sites: list[PlaceholderSite] = []
    for block in spec.blocks:
        sites += [PlaceholderSite(n, "block", block.name, line) for n, line, _ in placeholders_in(block.text)]
    for i, message in enumerate(spec.few_shot):
        sites += [
            PlaceholderSite(n, "few_shot", f"few_shot[{i}]", line)
            for n, line, _ in placeholders_in(message.content)
        ]
    for i, tool in enumerate(spec.tools):
        for path, text in _tool_strings(tool, f"tools[{i}]"):
            sites += [PlaceholderSite(n, "tools", path, 1) for n, _, _ in placeholders_in(text)]
    sites += [
        PlaceholderSite(n, "tail", "dynamic.template", line)
        for n, line, _ in placeholders_in(spec.tail.template)
    ]
    return sites


def validate_tool(tool: object, path: str) -> list[tuple[str, str]]:
    """OpenAI-style function tool: {"type": "function", "function": {"name", "parameters": {object}}}."""
    if not isinstance(tool, Mapping):
        return [(path, "must be a table/object")]
    problems: list[tuple[str, str]] = []
    if tool.get("type") != "function":
        problems.append((f"{path}.type", f'must be "function", got {tool.get("type")!r}'))
    function = tool.get("function")
    if not isinstance(function, Mapping):
        problems.append((f"{path}.function", "missing or not an object"))
        return problems
    name = function.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        problems.append((f"{path}.function.name", f"must be 1-64 of [A-Za-z0-9_-], got {name!r}"))
    if "description" in function and not isinstance(function["description"], str):
        problems.append((f"{path}.function.description", "must be a string"))
    parameters = function.get("parameters")
    if not isinstance(parameters, Mapping):
        problems.append((f"{path}.function.parameters", "missing or not a JSON-schema object"))
    elif parameters.get("type") != "object":
        problems.append(
            (f"{path}.function.parameters.type", f'must be "object", got {parameters.get("type")!r}')
        )
    elif "properties" in parameters and not isinstance(parameters["properties"], Mapping):
        problems.append((f"{path}.function.parameters.properties", "must be an object"))
    return problems


def validate_spec(spec: AgentSpec) -> list[tuple[str, str]]:
    """All problems of a spec at once, each with its field path."""
    problems: list[tuple[str, str]] = []
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", spec.id):
        problems.append(("id", f"must be a non-empty name of [A-Za-z0-9_.-], got {spec.id!r}"))
    if not spec.model:
        problems.append(("model", "must name a model profile"))
    problems += _block_problems(spec)
    problems += _message_problems(spec)
    problems += _declared_placeholder_problems(spec)
    problems += _tool_problems(spec)
    problems += _placeholder_use_problems(spec)
    return problems


def _block_problems(spec: AgentSpec) -> list[tuple[str, str]]:
    if not spec.blocks:
        return [("blocks", "at least one static block is required")]
    problems: list[tuple[str, str]] = []
    seen_blocks: set[str] = set()
    for i, block in enumerate(spec.blocks):
        if not block.name:
            problems.append((f"blocks[{i}].name", "must not be empty"))
        elif block.name in seen_blocks:
            problems.append((f"blocks[{i}].name", f"duplicate block name {block.name!r}"))
        seen_blocks.add(block.name)
        if not block.text.strip():
            problems.append((f"blocks[{i}].text", "is empty"))
    return problems


def _message_problems(spec: AgentSpec) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if spec.tail.role not in ROLES:
        problems.append(("dynamic.role", f"must be one of {', '.join(ROLES)}, got {spec.tail.role!r}"))
    if spec.tail.placement not in ("message", "system_end"):
        problems.append(
            ("dynamic.placement", f'must be "message" or "system_end", got {spec.tail.placement!r}')
        )
    for i, message in enumerate(spec.few_shot):
        if message.role not in ("user", "assistant"):
            problems.append((f"few_shot[{i}].role", f'must be "user" or "assistant", got {message.role!r}'))
    return problems


def _declared_placeholder_problems(spec: AgentSpec) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    names: set[str] = set()
    for p in spec.placeholders:
        path = f"placeholders.{p.name}"
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p.name):
            problems.append((path, "placeholder names are identifiers"))
        if p.name in names:
            problems.append((path, "declared twice"))
        names.add(p.name)
        if p.kind not in SAMPLE_KINDS:
            problems.append((f"{path}.kind", f"unknown kind {p.kind!r}; one of {', '.join(SAMPLE_KINDS)}"))
        if p.samples:
            if len(p.samples) < 2:
                problems.append((f"samples.{p.name}", "give at least two sample values, or none"))
            firsts = [s[:1] for s in p.samples]
            if len(set(firsts)) != len(firsts) or "" in firsts:
                # Samples sharing a first character would let the computed prefix run into the value.
                problems.append(
                    (f"samples.{p.name}", "sample values must be non-empty and start differently")
                )
    return problems


def _tool_problems(spec: AgentSpec) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for i, tool in enumerate(spec.tools):
        problems += validate_tool(tool, f"tools[{i}]")
    tool_names: list[object] = []
    for tool in spec.tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping):
            tool_names.append(function.get("name"))
    for name in {str(n) for n in tool_names if tool_names.count(n) > 1}:
        problems.append(("tools", f"duplicate tool name {name!r}"))
    return problems


def _placeholder_use_problems(spec: AgentSpec) -> list[tuple[str, str]]:
    """Every placeholder used is declared and every declared one used; turn 1 has a per-call part."""
    problems: list[tuple[str, str]] = []
    names = {p.name for p in spec.placeholders}
    used = set()
    for site in placeholder_sites(spec):
        used.add(site.placeholder)
        if site.placeholder not in names:
            where = "dynamic.template" if site.section == "tail" else site.where
            if site.section == "block":
                index = next(i for i, b in enumerate(spec.blocks) if b.name == site.where)
                where = f"blocks[{index}] ({site.where})"
            problems.append(
                (
                    f"{where} line {site.line}",
                    f"unknown placeholder {{{site.placeholder}}}: declare it under [placeholders] "
                    f"(or write {{{{{site.placeholder}}}}} for literal braces)",
                )
            )
    for name in sorted(names - used):
        problems.append((f"placeholders.{name}", "declared but never used"))
    if not any(s.section == "tail" for s in placeholder_sites(spec)) and not spec.tail.template.strip():
        problems.append(("dynamic.template", "is empty: a turn-1 request needs a per-call part"))
    return problems
