"""One LLM turn of a call as a dialer or a usage log records it: call id, turn index, who and where, and the
token usage the model's API answered with, read under the field names each API really uses.

The same reader serves `warmer hitrate --calls FILE` (JSON lines or CSV) and `POST /v1/usage`, so a record
means the same thing in a log file and on the wire. Pure: the CLI and the API do the reading.

Usage shapes, detected from which keys the usage object has (keys relative to it):

* OpenAI Chat Completions, and the engines' OpenAI-compatible answers: `prompt_tokens` (every prompt token)
  and `prompt_tokens_details.cached_tokens` (those read from the cache). OpenAI API reference, chat
  completion object `usage` (https://platform.openai.com/docs/api-reference/chat/object). vLLM fills the
  details with `--enable-prompt-tokens-details`; SGLang with `--enable-cache-report` and leaves them null
  when nothing was cached; llama-server always (`tools/server/README.md`, "Timings and context usage").
  Absent or null details count as 0 cached, and such records are counted (`no_cache_detail_records`), since
  a server started without the flag reports no hit at all.
* OpenAI Responses: `input_tokens` (every prompt token, cached ones INCLUDED) and
  `input_tokens_details.cached_tokens` (https://platform.openai.com/docs/api-reference/responses/object,
  `usage`; the same two paths are documented side by side at
  https://docs.x.ai/developers/advanced-api-usage/prompt-caching/usage-and-pricing).
* Anthropic Messages: `input_tokens` counts only the tokens AFTER the last cache breakpoint, EXCLUDING
  `cache_read_input_tokens` (read from the cache) and `cache_creation_input_tokens` (written to it), so the
  prompt is their sum (https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching, "Tracking cache
  performance"; the Messages API reference types both cache fields as nullable integers).
* warmer's own flat shape for hand-made CSVs: `prompt_tokens` and `cached_tokens` side by side.

`input_tokens` alone says neither which API wrote it nor whether cached tokens are inside it: that record
is refused, naming the field, rather than guessed.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

MAX_LABEL_CHARS = 200  # call ids, groups, agents, boxes: what a record may carry per label
MAX_TOKENS = 100_000_000  # a prompt larger than this is not a prompt but a broken counter
MAX_TURN = 100_000


class UsageApi(enum.StrEnum):
    """Which usage shape a record was read as."""

    CHAT_COMPLETIONS = "chat_completions"  # OpenAI Chat Completions and OpenAI-compatible engines
    RESPONSES = "responses"  # OpenAI Responses
    ANTHROPIC = "anthropic_messages"
    FLAT = "flat"  # prompt_tokens + cached_tokens


class UsageFieldError(ValueError):
    """A record field that is missing or not what its API says it is; `field` is its dotted path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class RecordFields:
    """Where a record keeps what is not usage (dotted paths; a CSV header may be dotted too)."""

    call: str = "call_id"
    turn: str = "turn"
    group: str = "direction"
    agent: str = "agent"
    box: str = "box"
    usage: str = "usage"  # the usage object; "" or absent: the usage keys sit at the top level


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One LLM request of a call: `prompt_tokens` counts every prompt token, cached ones included."""

    call_id: str
    turn: int  # 1 = the call's first LLM request
    prompt_tokens: int
    cached_tokens: int
    group: str = ""  # e.g. the call's direction; "" when the record has none
    agent: str = ""
    box: str = ""
    cache_write_tokens: int | None = None  # Anthropic's cache_creation_input_tokens; None elsewhere
    api: UsageApi = UsageApi.FLAT
    cached_reported: bool = True  # False: the usage named no cached count (read as 0)


_MISSING = object()
# A record without a usage object may carry these at its top level (a flat CSV, a flat JSON line).
_TOP_LEVEL_USAGE_KEYS = (
    "prompt_tokens",
    "input_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


def _get(document: Mapping[str, object], path: str) -> object:
    """The value at a dotted path, or `_MISSING`. A key containing the whole path (a dotted CSV header)
    wins over nesting."""
    if path in document:
        return document[path]
    node: object = document
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _int(value: object, field: str, *, limit: int = MAX_TOKENS) -> int:
    """A non-negative integer: a JSON integer, or a CSV cell of digits."""
    if isinstance(value, bool):
        raise UsageFieldError(field, "must be an integer, not a boolean")
    if isinstance(value, str):
        text = value.strip()
        if not text.isdigit() or not text.isascii():
            raise UsageFieldError(field, f"must be a non-negative integer, got {value[:40]!r}")
        value = int(text)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise UsageFieldError(field, f"must be a non-negative integer, got {type(value).__name__}")
    if value < 0 or value > limit:
        raise UsageFieldError(field, f"must be within 0..{limit:,}, got {value}")
    return value


def _label(document: Mapping[str, object], path: str, *, required: bool) -> str:
    value = _get(document, path)
    if value is _MISSING or value is None or value == "":
        if required:
            raise UsageFieldError(path, "missing")
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise UsageFieldError(path, "must be a string")
    text = str(value)
    if len(text) > MAX_LABEL_CHARS:
        raise UsageFieldError(path, f"longer than {MAX_LABEL_CHARS} characters")
    return text


def _optional_int(usage: Mapping[str, object], key: str, field: str) -> int | None:
    value = _get(usage, key)
    return None if value is _MISSING or value is None else _int(value, field)


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """Prompt tokens (cached included) and cached tokens, as one API reported them."""

    prompt_tokens: int
    cached_tokens: int
    api: UsageApi
    cache_write_tokens: int | None = None
    cached_reported: bool = True


def read_token_usage(usage: Mapping[str, object], at: str = "usage") -> TokenUsage:
    """The prompt and cached tokens of one usage object, whichever API wrote it (see the module doc).

    `at` is the usage object's dotted path, used only to name fields in errors."""
    prefix = f"{at}." if at else ""

    def field(key: str) -> str:
        return prefix + key

    anthropic_keys = ("cache_read_input_tokens", "cache_creation_input_tokens")
    if any(_get(usage, key) is not _MISSING for key in anthropic_keys):
        if _get(usage, "input_tokens") is _MISSING:
            raise UsageFieldError(field("input_tokens"), "missing (Anthropic usage)")
        uncached = _int(_get(usage, "input_tokens"), field("input_tokens"))
        read = _optional_int(usage, "cache_read_input_tokens", field("cache_read_input_tokens"))
        written = _optional_int(usage, "cache_creation_input_tokens", field("cache_creation_input_tokens"))
        cached = read or 0
        prompt = uncached + cached + (written or 0)
        return TokenUsage(prompt, cached, UsageApi.ANTHROPIC, written, read is not None)
    if _get(usage, "prompt_tokens") is not _MISSING:
        prompt = _int(_get(usage, "prompt_tokens"), field("prompt_tokens"))
        api, cached_key = UsageApi.CHAT_COMPLETIONS, "prompt_tokens_details.cached_tokens"
        details = _get(usage, "prompt_tokens_details")
        if details is not _MISSING and details is not None and not isinstance(details, Mapping):
            raise UsageFieldError(field("prompt_tokens_details"), "must be an object or null")
        if _get(usage, cached_key) is _MISSING and _get(usage, "cached_tokens") is not _MISSING:
            api, cached_key = UsageApi.FLAT, "cached_tokens"
        cached_value = _optional_int(usage, cached_key, field(cached_key))
        return _checked(prompt, cached_value, api, field(cached_key))
    if _get(usage, "input_tokens") is not _MISSING:
        if _get(usage, "input_tokens_details") is _MISSING:
            raise UsageFieldError(
                field("input_tokens"),
                "without input_tokens_details (OpenAI Responses: cached tokens included) or "
                "cache_read_input_tokens (Anthropic Messages: cached tokens excluded) the prompt size is "
                "ambiguous",
            )
        prompt = _int(_get(usage, "input_tokens"), field("input_tokens"))
        cached_key = "input_tokens_details.cached_tokens"
        cached_value = _optional_int(usage, cached_key, field(cached_key))
        return _checked(prompt, cached_value, UsageApi.RESPONSES, field(cached_key))
    raise UsageFieldError(
        field("prompt_tokens"),
        "missing: no prompt_tokens (OpenAI Chat Completions, engines), input_tokens (OpenAI Responses, "
        "Anthropic Messages) or prompt_tokens + cached_tokens",
    )


def _checked(prompt: int, cached: int | None, api: UsageApi, cached_field: str) -> TokenUsage:
    if cached is not None and cached > prompt:
        raise UsageFieldError(cached_field, f"{cached} cached tokens exceed the {prompt} prompt tokens")
    return TokenUsage(prompt, cached or 0, api, None, cached is not None)


def read_usage_record(document: Mapping[str, object], fields: RecordFields = RecordFields()) -> UsageRecord:
    """A record from one JSON object (a JSON line, a POST body) or one CSV row (dotted headers allowed).

    Raises `UsageFieldError` naming the first bad field."""
    call_id = _label(document, fields.call, required=True)
    turn_value = _get(document, fields.turn)
    if turn_value is _MISSING or turn_value is None or turn_value == "":
        raise UsageFieldError(fields.turn, "missing")
    turn = _int(turn_value, fields.turn, limit=MAX_TURN)
    if turn < 1:
        raise UsageFieldError(fields.turn, "turn indexes start at 1 (the call's first LLM request)")
    usage: object = document
    if fields.usage:
        nested = _get(document, fields.usage)
        if nested is not _MISSING:
            if not isinstance(nested, Mapping):
                raise UsageFieldError(fields.usage, "must be an object")
            usage = nested
        elif not any(_get(document, key) is not _MISSING for key in _TOP_LEVEL_USAGE_KEYS):
            raise UsageFieldError(fields.usage, "missing (and no usage keys at the top level either)")
    assert isinstance(usage, Mapping)  # the document itself, or checked above
    at = fields.usage if usage is not document else ""
    tokens = read_token_usage(usage, at)
    return UsageRecord(
        call_id=call_id,
        turn=turn,
        prompt_tokens=tokens.prompt_tokens,
        cached_tokens=tokens.cached_tokens,
        group=_label(document, fields.group, required=False),
        agent=_label(document, fields.agent, required=False),
        box=_label(document, fields.box, required=False),
        cache_write_tokens=tokens.cache_write_tokens,
        api=tokens.api,
        cached_reported=tokens.cached_reported,
    )


def nest_csv_row(row: Mapping[str, str | None]) -> dict[str, object]:
    """A CSV row as the nested object a JSON line would be: `usage.prompt_tokens_details.cached_tokens`
    headers become nested keys, and empty cells are left out (a missing value, not an empty string)."""
    out: dict[str, object] = {}
    for header, cell in row.items():
        if cell is None or cell == "" or not header:
            continue
        node = out
        *parents, leaf = header.strip().split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise UsageFieldError(header, f"clashes with the column {part!r}")
            node = child
        if isinstance(node.get(leaf), dict):
            raise UsageFieldError(header, "clashes with a nested column of the same name")
        node[leaf] = cell
    return out
