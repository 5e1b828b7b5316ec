"""`warmer lint` findings in the formats prompt repositories' CI reads: SARIF 2.1.0 and GitHub annotations.

A finding points at a `SpecPlace` (block, few-shot message, tail, field); `locate` turns that into a file
and a 1-based line of the spec file (or the included file a block came from), so code scanning and pull
request annotations land on the line to change. Pure: file contents come from an injected reader.

SARIF: OASIS SARIF 2.1.0 (errata01), schema `sarif-2.1/schema/sarif-schema-2.1.0.json` in
oasis-tcs/sarif-spec @ e0583813964ec43cea53b6b531b402866095ed1f. GitHub annotations: the workflow command
`::error file=F,line=L,title=T::message`, escaped as actions/toolkit `packages/core/src/command.ts`
(`escapeData`, `escapeProperty`) @ 4b9afa4c890de9d1a84c75bb617ee4d96207823a does.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from warmer.core.agents import AgentSpec
from warmer.core.lint import Finding, Severity, SpecPlace

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA_URI = (
    "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
)

ReadText = Callable[[str], str | None]

# One line per rule, for SARIF's rule metadata (what code scanning shows as the rule's title).
RULES: dict[str, str] = {
    "per-call-value-in-static-text": "A per-call value sits in static text, so the cached prefix stops there",
    "early-per-call-value": "The first per-call value comes early: most of the prompt is recomputed per call",
    "tools-after-dynamic-tail": "Tool definitions render after the dynamic tail and are recomputed per call",
    "tools-after-dynamic-value": "Tool definitions render after a per-call value and are recomputed per call",
    "few-shot-after-dynamic-tail": "Few-shot messages render after the dynamic tail: recomputed per call",
    "looks-per-call-uuid": "A UUID in static text looks like a per-call value",
    "looks-per-call-date": "A date in static text looks like a per-call value",
    "looks-per-call-time": "A time in static text looks like a per-call value",
    "looks-per-call-phone": "A phone number in static text looks like a per-call value",
    "looks-per-call-id": "An id in static text looks like a per-call value",
    "looks-per-call-amount": "An amount in static text looks like a per-call value",
    "tokenizer-drift": "The same prefix text tokenizes to a materially different count after an upgrade",
    "below-min-share": "The stable share of the turn-1 prompt is below --min-share",
}
_SARIF_LEVEL: dict[Severity, str] = {"error": "error", "warning": "warning", "info": "note"}
_GITHUB_COMMAND: dict[Severity, str] = {"error": "error", "warning": "warning", "info": "notice"}


@dataclass(frozen=True, slots=True)
class FileLine:
    path: str  # as the spec names it: the spec file, or an included file joined to the spec's folder
    line: int


@dataclass(frozen=True, slots=True)
class LocatedFinding:
    """One finding of one agent, with the file lines it points at (the first is the primary one)."""

    agent: str
    finding: Finding
    lines: tuple[FileLine, ...]


def _line_of(text: str | None, needle: str) -> int | None:
    """1-based line where `needle` starts in `text`, or None."""
    if text is None or not needle:
        return None
    at = text.find(needle)
    return None if at < 0 else text.count("\n", 0, at) + 1


def _field_line(text: str | None, path: str) -> int | None:
    """Line of a TOML key `a.b` (the `b = ...` line after `[a]`), else of the `[a]` table, else None."""
    if text is None:
        return None
    table, _, key = path.rpartition(".")
    lines = text.split("\n")
    start = 0
    if table:
        header = next((i for i, ln in enumerate(lines) if ln.strip() == f"[{table}]"), None)
        if header is None:
            return None
        start = header
    key_re = re.compile(rf"^\s*{re.escape(key)}\s*=")
    for i in range(start, len(lines)):
        if i > start and lines[i].lstrip().startswith("[") and table:
            break
        if key_re.match(lines[i]):
            return i + 1
    return start + 1 if table else None


def _within(text: str | None, body: str, line: int) -> int | None:
    """File line of `line` (1-based) of `body`, found verbatim (or by its first line) in `text`."""
    found = _line_of(text, body)
    if found is None:
        first = next((ln for ln in body.split("\n") if ln.strip()), "")
        # The body was escaped in the file (TOML escapes): its first line is the best anchor.
        return _line_of(text, first)
    return found + line - 1


def locate(spec: AgentSpec, place: SpecPlace, read: ReadText) -> FileLine:
    """The file and line a place in `spec` comes from; the spec file's line 1 when it cannot be found."""
    source = spec.source
    text = read(source) if source else None
    line: int | None = None
    if place.section == "block":
        block = next((b for b in spec.blocks if b.name == place.where), None)
        if block is not None and block.source:
            return FileLine(posixpath.join(posixpath.dirname(source), block.source), place.line)
        if block is not None:
            line = _within(text, block.text, place.line)
            if line is None:
                line = _line_of(text, f'name = "{block.name}"')
    elif place.section == "few_shot":
        index = int(place.where.removeprefix("few_shot[").removesuffix("]") or 0)
        if 0 <= index < len(spec.few_shot):
            line = _within(text, spec.few_shot[index].content, place.line)
    elif place.section == "tail":
        line = _within(text, spec.tail.template, place.line)
    elif place.section == "field":
        line = _field_line(text, place.where)
    elif place.section == "tools":
        line = _line_of(text, "tools_file") or _line_of(text, "[[tools]]")
    return FileLine(source, line or 1)


def locate_finding(spec: AgentSpec, finding: Finding, read: ReadText) -> LocatedFinding:
    places = finding.places or (SpecPlace("spec"),)
    return LocatedFinding(spec.id, finding, tuple(locate(spec, p, read) for p in places))


def _text(item: LocatedFinding) -> str:
    finding = item.finding
    text = f"{item.agent}: {finding.message}"
    return text + (f" -> {finding.advice}" if finding.advice else "")


def sarif_log(
    items: Sequence[LocatedFinding], *, tool_version: str, uri_of: Callable[[str], str] = lambda p: p
) -> dict[str, object]:
    """A SARIF 2.1.0 log with one run of warmer lint: one result per finding, rules for every code seen.

    `uri_of` turns a spec path into the artifact URI (relative to the repository root for code scanning).
    """
    codes = sorted({item.finding.code for item in items})
    rules = [{"id": code, "shortDescription": {"text": RULES.get(code, code)}} for code in codes]
    return {
        "$schema": SARIF_SCHEMA_URI,
        "version": SARIF_VERSION,
        "runs": [
            {
                "tool": {"driver": {"name": "warmer lint", "version": tool_version, "rules": rules}},
                "results": [_sarif_result(item, codes, uri_of) for item in items],
            }
        ],
    }


def _sarif_result(item: LocatedFinding, codes: list[str], uri_of: Callable[[str], str]) -> dict[str, object]:
    """One finding: its first spec line as the location, the others as related locations."""
    finding = item.finding

    def physical(fl: FileLine) -> dict[str, object]:
        return {"artifactLocation": {"uri": uri_of(fl.path)}, "region": {"startLine": fl.line}}

    logical = {
        "name": finding.location or item.agent,
        "fullyQualifiedName": f"{item.agent}/{finding.location}",
    }
    result: dict[str, object] = {
        "ruleId": finding.code,
        "ruleIndex": codes.index(finding.code),
        "level": _SARIF_LEVEL[finding.severity],
        "message": {"text": _text(item)},
        "locations": [
            {"physicalLocation": physical(fl), "logicalLocations": [logical]} for fl in item.lines[:1]
        ],
        "properties": {"agent": item.agent, "count": finding.count},
    }
    related = [{"id": i, "physicalLocation": physical(fl)} for i, fl in enumerate(item.lines[1:], start=1)]
    if related:
        result["relatedLocations"] = related
    return result


def _escape_data(value: str) -> str:
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(value: str) -> str:
    return _escape_data(value).replace(":", "%3A").replace(",", "%2C")


def github_annotations(
    items: Sequence[LocatedFinding], *, path_of: Callable[[str], str] = lambda p: p
) -> list[str]:
    """One GitHub Actions workflow command per finding (`::error file=..,line=..,title=..::message`)."""
    lines = []
    for item in items:
        finding = item.finding
        where = item.lines[0] if item.lines else None
        props = []
        if where is not None:
            props += [f"file={_escape_property(path_of(where.path))}", f"line={where.line}"]
        props.append(f"title={_escape_property(f'warmer lint {finding.code} ({item.agent})')}")
        lines.append(f"::{_GITHUB_COMMAND[finding.severity]} {','.join(props)}::{_escape_data(_text(item))}")
    return lines
