"""A tiny exact parser for the Prometheus text exposition format (version 0.0.4).

Core must not import prometheus_client, and the engines' /metrics pages only need the sample
lines: `name{label="value",...} value [timestamp]`. Comments (`# HELP`, `# TYPE`) and blank lines
are skipped. Format reference: https://prometheus.io/docs/instrumenting/exposition_formats/
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_SPECIAL_VALUES = {"+inf": math.inf, "inf": math.inf, "-inf": -math.inf, "nan": math.nan}
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class MetricsTextError(ValueError):
    """A /metrics body line that is not valid exposition text; names the line so it can be found."""

    def __init__(self, line_no: int, message: str) -> None:
        super().__init__(f"metrics line {line_no}: {message}")
        self.line_no = line_no


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample line: metric name, its labels (sorted pairs) and its value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


def _parse_labels(text: str, start: int, line_no: int) -> tuple[tuple[tuple[str, str], ...], int]:
    """Parse `{a="x",b="y"}` starting at the `{`; return the pairs and the index after `}`."""
    pairs: list[tuple[str, str]] = []
    i = start + 1
    while True:
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "}":
            return tuple(sorted(pairs)), i + 1
        match = _LABEL_NAME.match(text, i)
        if match is None:
            raise MetricsTextError(line_no, f"bad label name at column {i + 1}")
        key = match.group()
        i = match.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if text[i : i + 2] != '="':
            raise MetricsTextError(line_no, f'label {key!r} lacks ="value"')
        i += 2
        chars: list[str] = []
        while True:
            if i >= len(text):
                raise MetricsTextError(line_no, f"unterminated value of label {key!r}")
            char = text[i]
            if char == "\\":
                escaped = text[i + 1 : i + 2]
                if escaped not in _ESCAPES:
                    raise MetricsTextError(line_no, f"bad escape in label {key!r}")
                chars.append(_ESCAPES[escaped])
                i += 2
                continue
            if char == '"':
                i += 1
                break
            chars.append(char)
            i += 1
        pairs.append((key, "".join(chars)))
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == ",":
            i += 1
        elif i >= len(text) or text[i] != "}":
            raise MetricsTextError(line_no, "expected ',' or '}' after a label")


def _parse_value(token: str, line_no: int) -> float:
    special = _SPECIAL_VALUES.get(token.lower())
    if special is not None:
        return special
    try:
        return float(token)
    except ValueError:
        raise MetricsTextError(line_no, f"value {token!r} is not a number") from None


def parse_prometheus_text(text: str) -> list[Sample]:
    """Every sample in an exposition body, in order. Raises MetricsTextError on a malformed line."""
    samples: list[Sample] = []
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _NAME.match(line)
        if match is None:
            raise MetricsTextError(line_no, "line does not start with a metric name")
        name = match.group()
        i = match.end()
        labels: tuple[tuple[str, str], ...] = ()
        if i < len(line) and line[i] == "{":
            labels, i = _parse_labels(line, i, line_no)
        rest = line[i:].split()
        if not rest or len(rest) > 2:
            raise MetricsTextError(line_no, f"expected a value (and optional timestamp) after {name}")
        samples.append(Sample(name=name, labels=labels, value=_parse_value(rest[0], line_no)))
    return samples


def sum_samples(samples: Iterable[Sample], name: str) -> float | None:
    """Sum of every series of `name` (e.g. one per model or cache source); None when absent."""
    values = [s.value for s in samples if s.name == name and not math.isnan(s.value)]
    return sum(values) if values else None
