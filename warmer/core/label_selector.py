"""Kubernetes label selectors (`app=sglang,tier in (a,b),!canary`) read into requirements, so a bad
selector fails `check-config` by its field path instead of the first listing at run time.

The syntax is apimachinery's (pkg/labels/selector.go `Parse`): comma-separated requirements, each
`k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` (the label exists) or `!k` (it does not).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Operator = Literal["=", "!=", "in", "notin", "exists", "!exists"]

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_REQUIREMENT = re.compile(
    rf"^\s*(?:(?P<absent>!)\s*(?P<akey>{_KEY})"
    rf"|(?P<key>{_KEY})\s*(?:(?P<op>==|=|!=)\s*(?P<value>[-A-Za-z0-9_.]*)"
    rf"|\s+(?P<set>in|notin)\s*\((?P<values>[^()]*)\))?)\s*$"
)


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: Operator
    values: tuple[str, ...] = ()


def parse_label_selector(text: str) -> tuple[Requirement, ...]:
    """The requirements of `text`; ValueError names the part that is not one."""
    requirements: list[Requirement] = []
    for part in _split(text):
        match = _REQUIREMENT.match(part)
        if match is None:
            raise ValueError(f"not a label selector requirement: {part.strip()!r}")
        if match["absent"]:
            requirements.append(Requirement(match["akey"], "!exists"))
        elif match["op"]:
            operator: Operator = "!=" if match["op"] == "!=" else "="
            requirements.append(Requirement(match["key"], operator, (match["value"],)))
        elif match["set"]:
            values = tuple(value.strip() for value in match["values"].split(",") if value.strip())
            requirements.append(Requirement(match["key"], "in" if match["set"] == "in" else "notin", values))
        else:
            requirements.append(Requirement(match["key"], "exists"))
    if not requirements:
        raise ValueError("an empty label selector would match every pod of the namespace")
    keys = [requirement.key for requirement in requirements]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise ValueError(f"label selector names {', '.join(twice)} more than once")
    return tuple(requirements)


def _split(text: str) -> list[str]:
    """The comma-separated requirements, commas inside `( )` kept together."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]
