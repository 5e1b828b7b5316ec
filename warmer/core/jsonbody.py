"""Parsing a JSON request body that anyone could have written: bounded depth, bounded numbers, strict JSON.

Python's `json` recurses once per nesting level and raises RecursionError (not ValueError) past the
interpreter's limit; it turns a 5,000-digit integer into a ValueError about `int` digits, `1e400` into
infinity, and accepts `NaN` / `Infinity`, which are not JSON. Each of those would reach code that expects a
plain document. `parse_json_body` refuses all of them up front with one error type and a reason a client can
act on, so every front door answers 400 instead of failing somewhere deeper.
"""

from __future__ import annotations

import array
import itertools
import json
import math
import re
from typing import Any

from warmer.core.errors import WarmerError

# Deeper than any document warmer accepts: an agent spec in a deploy event is about 6 levels.
MAX_JSON_DEPTH = 64
# Characters of one number literal: unix seconds with nanoseconds or a float's 17 digits and exponent fit.
MAX_NUMBER_CHARS = 40

# A JSON string literal, removed before counting brackets so brackets inside strings do not count. The
# closing quote is optional so a match never fails and backtracks: linear time on any input (an
# unterminated string just runs to the end, and the parser reports the body as not JSON).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
# Outside strings, a run of number characters this long is one over-long number literal.
_LONG_NUMBER = re.compile(rb"[-+.eE0-9]{%d,}" % (MAX_NUMBER_CHARS + 1))
_NOT_A_BRACKET = re.compile(rb"[^\[\]{}]+")
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 / -1 as signed bytes


class JsonBodyRejected(WarmerError):
    """The body is not a JSON document warmer will read; `reason` says why (HTTP 400)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _NumberRejected(ValueError):
    """Raised from inside `json.loads` hooks; turned into JsonBodyRejected."""


def nesting_depth(raw: bytes) -> int:
    """How deep arrays/objects nest in `raw`, without recursing and at C speed on any size of body.

    Strings and scalars are dropped, leaving only brackets; an opening bracket counts +1 and a closing one
    -1 (as signed bytes), and the deepest point is the largest running sum. An unbalanced body gets some
    number; the parser then reports it as not JSON."""
    return _depth(_STRING.sub(b"", raw))


def _depth(without_strings: bytes) -> int:
    brackets = _NOT_A_BRACKET.sub(b"", without_strings).translate(_STEPS)
    return max(itertools.accumulate(array.array("b", brackets)), default=0)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NumberRejected(f"number {text} is out of range")
    return value


def _constant(text: str) -> Any:
    raise _NumberRejected(f"{text} is not JSON")


_DECODER = json.JSONDecoder(parse_float=_float, parse_constant=_constant)


def parse_json_body(raw: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The parsed document, or JsonBodyRejected with the reason (not JSON, too deep, a wild number)."""
    without_strings = _STRING.sub(b"", raw)
    if _depth(without_strings) > max_depth:
        raise JsonBodyRejected(f"JSON nested deeper than {max_depth} levels")
    long_number = _LONG_NUMBER.search(without_strings)
    if long_number is not None:
        raise JsonBodyRejected(f"a number is longer than {MAX_NUMBER_CHARS} characters")
    try:
        # What `json.loads(raw, parse_float=..., parse_constant=...)` does, without building a decoder per
        # body (a pre-call ask is parsed thousands of times a second).
        return _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except _NumberRejected as exc:
        raise JsonBodyRejected(str(exc)) from None
    except UnicodeDecodeError:
        raise JsonBodyRejected("not valid JSON: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise JsonBodyRejected(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:  # a backstop: nothing the parser raises may escape as a 500
        raise JsonBodyRejected(f"not valid JSON: {type(exc).__name__}") from None
