"""The stable prefix is computed from rendered, tokenized samples; each trap from the field has a test."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.prompt_helpers import byte_tokenize, chatml, spec, tool, word_tokenize
from warmer.core.agent_requests import build_request, sample_values
from warmer.core.agents import Placeholder
from warmer.core.chat_template import ChatTemplate, ChatTemplateError
from warmer.core.errors import ConfigError
from warmer.core.lint import lint_agent, shared_prefixes
from warmer.core.model import Prefix, prefix_hash
from warmer.core.prefix import TokenizeFn, common_prefix_length, compute_stable_prefix, render_sample

# A template in the style of several tool-calling models: the system text first, THEN the tool list,
# then the rest of the conversation. A value at the end of the system text sits before every tool token.
TOOLS_AFTER_SYSTEM = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}<|system|>{{ message['content'] }}"
    "{% if tools %}\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}<|end|>\n"
    "{% else %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_prefix_ends_where_the_tail_value_starts_and_round_trips() -> None:
    agent = spec()
    stable = compute_stable_prefix(agent, chatml, byte_tokenize)

    rendered = render_sample(agent, chatml, 0)
    assert stable.text == rendered[: rendered.index("Ana Souza")]
    assert stable.text.endswith("<|im_start|>user\nCustomer: ")
    assert tuple(byte_tokenize(stable.text)) == stable.token_ids
    assert stable.token_count == stable.first_dynamic_token_offset == len(stable.token_ids)
    assert stable.turn1_prompt_tokens == len(byte_tokenize(rendered))
    assert stable.stable_share == pytest.approx(stable.token_count / stable.turn1_prompt_tokens)
    assert stable.hash == Prefix(stable.text, stable.token_count, stable.token_ids).hash
    assert stable.as_prefix().hash == stable.hash
    assert stable.first_dynamic_site is not None
    assert (stable.first_dynamic_site.section, stable.first_dynamic_site.line) == ("tail", 1)


def test_placeholder_in_static_block_is_rendered_and_stops_the_prefix_there() -> None:
    agent = spec(blocks=(("persona", "You are Maya.\nYou call {customer_name} today.\nBe kind."),))
    stable = compute_stable_prefix(agent, chatml, byte_tokenize)

    assert stable.text.endswith("You are Maya.\nYou call ")
    site = stable.first_dynamic_site
    assert site is not None
    assert (site.section, site.where, site.line, site.placeholder) == ("block", "persona", 2, "customer_name")
    assert "Be kind." in render_sample(agent, chatml, 0)  # rendered like the engine would, not rejected


def test_whitespace_at_the_boundary_belongs_to_the_value_token() -> None:
    """Characters agree up to "Customer: " but a BPE-style token is " Ana": tokens split before the space."""
    agent = spec(tail="Customer: {customer_name}")
    texts = [render_sample(agent, chatml, i) for i in range(3)]
    char_boundary = common_prefix_length(texts)
    assert texts[0][:char_boundary].endswith("Customer: ")

    stable = compute_stable_prefix(agent, chatml, word_tokenize)

    assert stable.text.endswith("Customer:")  # snapped back to the token boundary: the space is not stable
    assert stable.first_dynamic_char_offset == char_boundary
    assert word_tokenize(stable.text) == list(stable.token_ids)
    for text in texts:
        assert word_tokenize(text)[: stable.token_count] == list(stable.token_ids)


def test_tools_after_system_template_makes_a_system_end_tail_unreachable() -> None:
    template = ChatTemplate(TOOLS_AFTER_SYSTEM)
    tools = (tool("send_offer_link", "Send the offer link. " * 20), tool("end_call"))
    naive = spec(tools=tools, placement="system_end")
    fixed = spec(tools=tools, placement="message")

    naive_stable = compute_stable_prefix(naive, template, byte_tokenize)
    fixed_stable = compute_stable_prefix(fixed, template, byte_tokenize)

    assert not naive_stable.tools_reachable
    assert "send_offer_link" not in naive_stable.text
    assert fixed_stable.tools_reachable
    assert "send_offer_link" in fixed_stable.text
    assert "end_call" in fixed_stable.text
    assert fixed_stable.token_count > naive_stable.token_count + 400
    codes = {f.code for f in lint_agent(naive, template, byte_tokenize).findings}
    assert "tools-after-dynamic-tail" in codes
    assert "tools-after-dynamic-tail" not in {
        f.code for f in lint_agent(fixed, template, byte_tokenize).findings
    }


def test_template_that_ignores_tools_does_not_claim_they_are_unreachable() -> None:
    stable = compute_stable_prefix(spec(tools=(tool("end_call"),)), chatml, byte_tokenize)
    assert stable.tools_char_offset is None
    assert stable.tools_reachable


def test_two_agents_with_identical_static_parts_share_one_prefix_hash() -> None:
    blocks = (("persona", "You are Maya from Northwind.\nBe brief."), ("rules", "Never promise discounts."))
    sales = spec(agent_id="sales", blocks=blocks, tail="Customer: {customer_name}\nNow: {now}")
    retention = spec(agent_id="retention", blocks=blocks, tail="Customer: {customer_name}\nLeft on: {now}")
    other = spec(agent_id="support", blocks=(("persona", "You are Sam."),))

    stables = [compute_stable_prefix(a, chatml, byte_tokenize) for a in (sales, retention, other)]

    assert sales.spec_hash != retention.spec_hash  # different specs...
    assert stables[0].hash == stables[1].hash  # ...one cache entry
    assert stables[2].hash != stables[0].hash
    assert shared_prefixes(stables) == {stables[0].hash: ["sales", "retention"]}


def test_a_spec_without_per_call_values_is_entirely_stable() -> None:
    agent = spec(tail="The call has connected.", placeholders=())
    stable = compute_stable_prefix(agent, chatml, byte_tokenize)
    assert stable.token_count == stable.turn1_prompt_tokens
    assert stable.first_dynamic_site is None
    assert stable.stable_share == 1.0


def test_needs_two_samples() -> None:
    with pytest.raises(ValueError, match="two sample"):
        compute_stable_prefix(spec(), chatml, byte_tokenize, samples=1)


def test_chat_template_errors_are_config_errors() -> None:
    strict = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="user first"):
        compute_stable_prefix(spec(), strict, byte_tokenize)
    with pytest.raises(ConfigError, match="chat_template"):
        ChatTemplate("{% for %}")


def test_tojson_keeps_non_ascii_like_hf() -> None:
    template = ChatTemplate("{{ tools | tojson }}")
    assert (
        template([], [{"type": "function", "function": {"name": "x", "description": "café"}}]).count("café")
        == 1
    )


def test_build_request_puts_every_per_call_value_in_the_last_message() -> None:
    agent = spec(blocks=(("persona", "You are Maya."),))
    values = sample_values(agent, 1)
    request = build_request(agent, values)
    assert [m["role"] for m in request.messages] == ["system", "user"]
    assert all(v not in str(request.messages[0]["content"]) for v in values.values())
    assert all(v in str(request.messages[-1]["content"]) for v in values.values())


# --- properties -----------------------------------------------------------------------------------------

_words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz .,:\n", min_size=1, max_size=40).filter(str.strip)


@settings(max_examples=60, deadline=None)
@given(
    persona=_words,
    rules=_words,
    head=st.text(alphabet="abcdefghij :\n", max_size=20),
    samples=st.integers(min_value=2, max_value=5),
    use_words=st.booleans(),
)
def test_stable_prefix_is_a_prefix_of_every_rendered_sample(
    persona: str, rules: str, head: str, samples: int, use_words: bool
) -> None:
    agent = spec(blocks=(("persona", persona), ("rules", rules)), tail=head + "{customer_name} at {now}")
    tokenize = word_tokenize if use_words else byte_tokenize
    stable = compute_stable_prefix(agent, chatml, tokenize, samples=samples)
    for i in range(samples + 2):  # also calls that were not among the samples
        rendered = render_sample(agent, chatml, i)
        assert rendered.startswith(stable.text)
        assert tuple(tokenize(rendered)[: stable.token_count]) == stable.token_ids


def _render_tools(messages: Sequence[Mapping[str, object]], tools: Sequence[Mapping[str, object]]) -> str:
    return ChatTemplate(TOOLS_AFTER_SYSTEM)(messages, tools)


@settings(max_examples=60, deadline=None)
@given(
    words=st.lists(
        st.sampled_from(["call", "the", "customer", "be", "kind", "plan", "\n", "rule:"]),
        min_size=2,
        max_size=30,
    ),
    data=st.data(),
)
def test_moving_a_dynamic_value_later_never_shrinks_the_prefix(words: list[str], data: st.DataObject) -> None:
    words = ["Rules:", *words]  # a static block is never empty
    early = data.draw(st.integers(min_value=0, max_value=len(words)))
    later = data.draw(st.integers(min_value=early, max_value=len(words)))
    tokenizers: list[TokenizeFn] = [byte_tokenize, word_tokenize]
    tokenize = tokenizers[data.draw(st.integers(min_value=0, max_value=1))]

    def with_value_at(position: int) -> int:
        text = " ".join([*words[:position], "{customer_name}", *words[position:]])
        agent = spec(blocks=(("persona", text),))
        return compute_stable_prefix(agent, chatml, tokenize).token_count

    into_tail = compute_stable_prefix(
        spec(blocks=(("persona", " ".join(words)),)), chatml, tokenize
    ).token_count
    assert with_value_at(early) <= with_value_at(later) <= into_tail


def test_explicit_samples_are_used_in_order() -> None:
    agent = spec(
        tail="Plan: {plan}",
        placeholders=(Placeholder("plan", "text", ("Basic", "Plus")),),
    )
    assert [sample_values(agent, i)["plan"] for i in range(3)] == ["Basic", "Plus", "Basic"]


def test_a_prefix_hash_is_computed_once_and_follows_a_replaced_text_or_ids() -> None:
    prefix = Prefix(text="You sell things.", token_count=3, token_ids=(1, 2, 3))
    assert prefix.hash == prefix_hash("You sell things.", (1, 2, 3))
    assert replace(prefix, token_ids=(1, 2, 4)).hash == prefix_hash("You sell things.", (1, 2, 4))
    assert replace(prefix, text="Other.", token_ids=None).hash == prefix_hash("Other.", None)
    assert replace(prefix, model="m").hash == prefix.hash
    assert "hash" not in repr(prefix)
