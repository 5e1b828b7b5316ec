"""Usage records read under each API's own field names (`warmer.core.call_usage`).

Shapes cited where they are defined:
* OpenAI Chat Completions `usage.prompt_tokens` + `usage.prompt_tokens_details.cached_tokens`, and OpenAI
  Responses `usage.input_tokens` + `usage.input_tokens_details.cached_tokens` (cached tokens are part of
  the input count): https://platform.openai.com/docs/api-reference/chat/object,
  https://platform.openai.com/docs/api-reference/responses/object; both side by side, with the example
  figures used below (125 prompt tokens, 98 cached), at
  https://docs.x.ai/developers/advanced-api-usage/prompt-caching/usage-and-pricing.
* Anthropic Messages `usage.input_tokens` (after the last cache breakpoint), `cache_read_input_tokens`,
  `cache_creation_input_tokens` (nullable): https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching
  ("Tracking cache performance": total input = the three summed).
* The engines' OpenAI-compatible answers: `tests/unit/engine_shapes.py` (`openai_completion`, cited there:
  vLLM --enable-prompt-tokens-details, SGLang --enable-cache-report with null details when nothing was
  cached, llama-server's README).
"""

from __future__ import annotations

import pytest

from tests.unit.engine_shapes import openai_completion
from warmer.core.call_usage import (
    RecordFields,
    UsageApi,
    UsageFieldError,
    nest_csv_row,
    read_token_usage,
    read_usage_record,
)


def test_openai_chat_completions_usage_counts_cached_inside_prompt_tokens() -> None:
    usage = {
        "prompt_tokens": 125,
        "completion_tokens": 48,
        "total_tokens": 173,
        "prompt_tokens_details": {
            "text_tokens": 125,
            "audio_tokens": 0,
            "image_tokens": 0,
            "cached_tokens": 98,
        },
    }
    tokens = read_token_usage(usage)
    assert (tokens.prompt_tokens, tokens.cached_tokens, tokens.api) == (125, 98, UsageApi.CHAT_COMPLETIONS)


def test_openai_responses_usage_counts_cached_inside_input_tokens() -> None:
    usage = {
        "input_tokens": 125,
        "output_tokens": 48,
        "total_tokens": 173,
        "input_tokens_details": {"cached_tokens": 98},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    tokens = read_token_usage(usage)
    assert (tokens.prompt_tokens, tokens.cached_tokens, tokens.api) == (125, 98, UsageApi.RESPONSES)


def test_anthropic_input_tokens_exclude_cache_reads_and_writes() -> None:
    usage = {
        "input_tokens": 50,
        "cache_creation_input_tokens": 248,
        "cache_read_input_tokens": 1800,
        "output_tokens": 503,
    }
    tokens = read_token_usage(usage)
    assert (tokens.prompt_tokens, tokens.cached_tokens) == (50 + 248 + 1800, 1800)
    assert (tokens.cache_write_tokens, tokens.api) == (248, UsageApi.ANTHROPIC)


def test_anthropic_null_cache_fields_are_zero() -> None:
    tokens = read_token_usage(
        {"input_tokens": 900, "cache_creation_input_tokens": None, "cache_read_input_tokens": None}
    )
    assert (tokens.prompt_tokens, tokens.cached_tokens, tokens.cached_reported) == (900, 0, False)


@pytest.mark.parametrize(("cached", "expected", "reported"), [(896, 896, True), (None, 0, False)])
def test_engine_openai_compatible_answers(cached: int | None, expected: int, reported: bool) -> None:
    """vLLM/llama-server fill the details; SGLang leaves them null when nothing was cached."""
    usage = openai_completion(1001, cached)["usage"]
    tokens = read_token_usage(usage)
    assert (tokens.prompt_tokens, tokens.cached_tokens, tokens.cached_reported) == (1001, expected, reported)


def test_an_engine_without_cache_details_reads_as_zero_cached_and_says_so() -> None:
    tokens = read_token_usage(openai_completion(1001, None, details=False)["usage"])
    assert (tokens.cached_tokens, tokens.cached_reported) == (0, False)


def test_input_tokens_alone_are_ambiguous_and_refused() -> None:
    with pytest.raises(UsageFieldError) as caught:
        read_token_usage({"input_tokens": 7200})
    assert caught.value.field == "usage.input_tokens"
    assert "ambiguous" in caught.value.message


@pytest.mark.parametrize(
    ("usage", "field"),
    [
        (
            {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 101}},
            "usage.prompt_tokens_details.cached_tokens",
        ),
        ({"prompt_tokens": -1}, "usage.prompt_tokens"),
        ({"prompt_tokens": True}, "usage.prompt_tokens"),
        ({"prompt_tokens": "12x"}, "usage.prompt_tokens"),
        ({"prompt_tokens": 10, "prompt_tokens_details": 5}, "usage.prompt_tokens_details"),
        ({"cache_read_input_tokens": 5}, "usage.input_tokens"),
        ({"completion_tokens": 5}, "usage.prompt_tokens"),
    ],
)
def test_bad_usage_names_the_field(usage: dict[str, object], field: str) -> None:
    with pytest.raises(UsageFieldError) as caught:
        read_token_usage(usage)
    assert caught.value.field == field


def test_a_record_carries_call_turn_group_agent_and_box() -> None:
    record = read_usage_record(
        {
            "call_id": "c-1",
            "turn": 2,
            "direction": "inbound",
            "agent": "support",
            "box": "llama-1",
            "usage": {"prompt_tokens": 3000, "prompt_tokens_details": {"cached_tokens": 2900}},
        }
    )
    assert (record.call_id, record.turn, record.group, record.agent, record.box) == (
        "c-1",
        2,
        "inbound",
        "support",
        "llama-1",
    )
    assert (record.prompt_tokens, record.cached_tokens) == (3000, 2900)


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"turn": 1, "usage": {"prompt_tokens": 1}}, "call_id"),
        ({"call_id": "c", "usage": {"prompt_tokens": 1}}, "turn"),
        ({"call_id": "c", "turn": 0, "usage": {"prompt_tokens": 1}}, "turn"),
        ({"call_id": "c", "turn": 1, "usage": [1]}, "usage"),
        ({"call_id": "c", "turn": 1, "completion_tokens": 3}, "usage"),
        ({"call_id": ["c"], "turn": 1, "usage": {"prompt_tokens": 1}}, "call_id"),
        ({"call_id": "c" * 201, "turn": 1, "usage": {"prompt_tokens": 1}}, "call_id"),
    ],
)
def test_bad_records_name_the_field(document: dict[str, object], field: str) -> None:
    with pytest.raises(UsageFieldError) as caught:
        read_usage_record(document)
    assert caught.value.field == field


def test_a_flat_csv_row_and_dotted_headers_read_like_the_json_line() -> None:
    flat = nest_csv_row(
        {"call_id": "c", "turn": "1", "prompt_tokens": "7200", "cached_tokens": "1024", "box": ""}
    )
    dotted = nest_csv_row(
        {
            "call_id": "c",
            "turn": "1",
            "usage.prompt_tokens": "7200",
            "usage.prompt_tokens_details.cached_tokens": "1024",
        }
    )
    for row, api in ((flat, UsageApi.FLAT), (dotted, UsageApi.CHAT_COMPLETIONS)):
        record = read_usage_record(row)
        assert (record.prompt_tokens, record.cached_tokens, record.api, record.box) == (7200, 1024, api, "")


def test_field_names_are_configurable() -> None:
    fields = RecordFields(call="id", turn="llm_turn", group="kind", usage="response.usage")
    record = read_usage_record(
        {"id": "x", "llm_turn": "3", "kind": "outbound", "response": {"usage": {"prompt_tokens": 9}}}, fields
    )
    assert (record.call_id, record.turn, record.group, record.prompt_tokens) == ("x", 3, "outbound", 9)
