"""Agent spec files: one `*.toml` per agent in the agents directory -> `warmer.core.agents.AgentSpec`.

Format (see config/agents/outbound-sales.toml for a full example):

    model = "tiny-demo"                  # a model profile name (models/<name>.toml)
    id = "outbound-sales"                # optional; defaults to the file stem
    block_separator = "\\n\\n"             # optional; how static blocks are joined into the system text

    [[blocks]]                           # ordered static text, identical on every call
    name = "persona"
    text = "..."                         # inline, or:
    # file = "outbound-sales/persona.md" # relative to this spec file

    tools_file = "outbound-sales.tools.json"   # a JSON list of function tools, or inline [[tools]] tables

    [[few_shot]]                         # optional static example turns
    role = "user"
    content = "..."

    [dynamic]                            # every per-call value lives here, rendered LAST
    template = "Customer: {customer_name}\\nNow: {now}\\nCall id: {call_id}"
    role = "user"                        # the final message's role (default "user")
    placement = "message"                # or "system_end" (appended to the system text)

    [placeholders]                       # every placeholder, with the kind of its sample values
    customer_name = "name"               # name|datetime|date|time|uuid|id|phone|number|amount|text
    call_id = { kind = "uuid" }

    [samples]                            # optional explicit sample values (>= 2, different first chars)
    customer_name = ["Ana Souza", "Bilal Khan"]

Every problem of every file is collected before raising, with paths like
`agents/sales.toml: blocks[2].file: not found`.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path

from warmer.core.agents import (
    AgentSpec,
    DynamicTail,
    FewShotMessage,
    Placeholder,
    StaticBlock,
)
from warmer.core.errors import ConfigError

Problem = tuple[str, str]
_UNREADABLE = (
    "(unreadable)"  # stands in for a block whose text could not be read, while problems are collected
)

_TOP_KEYS = {"id", "model", "block_separator", "blocks", "tools", "tools_file", "few_shot", "dynamic",
             "placeholders", "samples"}  # fmt: skip


def _read_text(base: Path | None, name: object, path: str, problems: list[Problem]) -> str | None:
    if base is None:  # a spec from the network (deploy webhook) must never make the daemon read its files
        problems.append((path, "file references are not allowed here: give the text inline"))
        return None
    if not isinstance(name, str) or not name:
        problems.append((path, "must be a relative file name"))
        return None
    target = base / name
    if not target.is_file():
        problems.append((path, f"not found: {name}"))
        return None
    try:
        return target.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        problems.append((path, f"cannot read {name}: {exc}"))
        return None


def _blocks(data: Mapping[str, object], base: Path | None, problems: list[Problem]) -> list[StaticBlock]:
    raw = data.get("blocks")
    if not isinstance(raw, list) or not raw:
        problems.append(("blocks", "at least one [[blocks]] table is required"))
        return []
    blocks: list[StaticBlock] = []
    for i, entry in enumerate(raw):
        path = f"blocks[{i}]"
        if not isinstance(entry, dict):
            problems.append((path, "must be a table"))
            continue
        unknown = set(entry) - {"name", "text", "file"}
        if unknown:
            hint = ""
            if unknown & _TOP_KEYS:
                hint = " (top-level keys must come before the first [[blocks]] table in TOML)"
            problems.append((path, f"unknown keys: {', '.join(sorted(unknown))}{hint}"))
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            problems.append((f"{path}.name", "required"))
            name = f"block{i}"
        has_text, has_file = "text" in entry, "file" in entry
        if has_text == has_file:
            problems.append((path, "give exactly one of text or file"))
            blocks.append(StaticBlock(name, _UNREADABLE))
            continue
        if has_text:
            text = entry["text"]
            if not isinstance(text, str):
                problems.append((f"{path}.text", "must be a string"))
                text = _UNREADABLE
            blocks.append(StaticBlock(name, text))
        else:
            loaded = _read_text(base, entry["file"], f"{path}.file", problems)
            # An unreadable file keeps its slot, so later problems still name the right blocks[i].
            blocks.append(
                StaticBlock(name, loaded if loaded is not None else _UNREADABLE, source=str(entry["file"]))
            )
    return blocks


def _tools(
    data: Mapping[str, object], base: Path | None, problems: list[Problem]
) -> list[Mapping[str, object]]:
    if "tools" in data and "tools_file" in data:
        problems.append(("tools", "give tools or tools_file, not both"))
        return []
    if "tools_file" in data:
        text = _read_text(base, data["tools_file"], "tools_file", problems)
        if text is None:
            return []
        try:
            raw: object = json.loads(text)
        except json.JSONDecodeError as exc:
            problems.append(("tools_file", f"invalid JSON: {exc}"))
            return []
        where = "tools_file"
    else:
        raw = data.get("tools", [])
        where = "tools"
    if not isinstance(raw, list):
        problems.append((where, "must be a list of tool definitions"))
        return []
    return [t if isinstance(t, dict) else {"invalid": t} for t in raw]


def _placeholders(data: Mapping[str, object], problems: list[Problem]) -> list[Placeholder]:
    declared = data.get("placeholders", {})
    samples = data.get("samples", {})
    if not isinstance(declared, dict):
        problems.append(("placeholders", "must be a table of name = kind"))
        return []
    if not isinstance(samples, dict):
        problems.append(("samples", "must be a table of name = [values]"))
        samples = {}
    result: list[Placeholder] = []
    for name, spec in declared.items():
        kind: object = spec
        own_samples: object = samples.get(name, [])
        if isinstance(spec, dict):
            kind = spec.get("kind", "text")
            own_samples = spec.get("samples", own_samples)
        if not isinstance(kind, str):
            problems.append((f"placeholders.{name}", "kind must be a string"))
            continue
        if not isinstance(own_samples, list) or not all(isinstance(s, str) for s in own_samples):
            problems.append((f"samples.{name}", "must be a list of strings"))
            own_samples = []
        result.append(Placeholder(name, kind, tuple(own_samples)))
    for name in sorted(set(samples) - set(declared)):
        problems.append((f"samples.{name}", "sample values for an undeclared placeholder"))
    return result


def load_agent_spec(path: Path) -> AgentSpec:
    """Parse one spec file; ConfigError paths are relative to the file (`blocks[2].file`)."""
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError([("", f"cannot read: {exc.strerror}")]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([("", f"invalid TOML: {exc}")]) from None
    return agent_spec_from_data(data, default_id=path.stem, base=path.parent, source=str(path))


def agent_spec_from_data(
    data: Mapping[str, object], *, default_id: str, base: Path | None, source: str
) -> AgentSpec:
    """A spec from already-parsed data (a spec file's TOML, or a deploy event's JSON).

    `base` is the directory `file`/`tools_file` references are read from; None refuses them (a spec that
    arrives over the network must not name files on the daemon's host).
    """
    problems: list[Problem] = []
    unknown = set(data) - _TOP_KEYS
    if unknown:
        problems.append(("", f"unknown keys: {', '.join(sorted(unknown))}"))
    agent_id = data.get("id", default_id)
    model = data.get("model")
    if not isinstance(model, str) or not model:
        problems.append(("model", "required: the name of a model profile"))
        model = ""
    separator = data.get("block_separator", "\n\n")
    if not isinstance(separator, str):
        problems.append(("block_separator", "must be a string"))
        separator = "\n\n"
    blocks = _blocks(data, base, problems)
    tools = _tools(data, base, problems)
    placeholders = _placeholders(data, problems)

    few_shot: list[FewShotMessage] = []
    raw_few = data.get("few_shot", [])
    if not isinstance(raw_few, list):
        problems.append(("few_shot", "must be a list of {role, content} tables"))
        raw_few = []
    for i, entry in enumerate(raw_few):
        if not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
            problems.append((f"few_shot[{i}]", "must be a table with role and content strings"))
            continue
        few_shot.append(FewShotMessage(str(entry.get("role", "")), entry["content"]))

    dynamic = data.get("dynamic")
    tail = DynamicTail(" ")
    if not isinstance(dynamic, dict) or not isinstance(dynamic.get("template"), str):
        problems.append(("dynamic.template", "required: the per-call tail template"))
    else:
        unknown_dynamic = set(dynamic) - {"template", "role", "placement"}
        if unknown_dynamic:
            problems.append(("dynamic", f"unknown keys: {', '.join(sorted(unknown_dynamic))}"))
        placement = dynamic.get("placement", "message")
        tail = DynamicTail(dynamic["template"], str(dynamic.get("role", "user")), placement)
    try:  # the spec's own checks (placeholders, tools, names) run even when the file had problems
        spec = AgentSpec(
            id=str(agent_id),
            model=model,
            blocks=tuple(blocks),
            tail=tail,
            placeholders=tuple(placeholders),
            tools=tuple(tools),
            few_shot=tuple(few_shot),
            block_separator=separator,
            source=source,
        )
    except ConfigError as exc:
        reported = {path for path, _ in problems}  # one message per field: the file-level one wins
        problems += [p for p in exc.problems if p[0] not in reported]
    if problems:
        raise ConfigError(problems)
    return spec


def load_agent_specs(directory: Path) -> dict[str, AgentSpec]:
    """Every `*.toml` in `directory`, by agent id. All problems of all files are collected, then raised."""
    if not directory.is_dir():
        raise ConfigError([(str(directory), "agents directory not found")])
    specs: dict[str, AgentSpec] = {}
    problems: list[Problem] = []
    for path in sorted(directory.glob("*.toml")):
        label = f"{directory.name}/{path.name}"
        try:
            spec = load_agent_spec(path)
        except ConfigError as exc:
            problems += [(f"{label}: {p}" if p else label, msg) for p, msg in exc.problems]
            continue
        if spec.id in specs:
            problems.append((f"{label}: id", f"agent id {spec.id!r} is defined twice"))
            continue
        specs[spec.id] = spec
    if problems:
        raise ConfigError(problems)
    return specs
