"""Agent spec files: the shipped examples load; every mistake is reported at once with its file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.tiny_model import BOS_ID, IM_END_ID, IM_START_ID, byte_token_id
from tests.unit.prompt_helpers import AGENTS_DIR, MODELS_DIR, spec, tool
from warmer.config.agents import load_agent_specs
from warmer.config.profiles import load_profile
from warmer.config.tokenizer import FileTokenizer, byte_spm_tokenizer, load_tokenizer, offline_tokenizer
from warmer.core.agent_requests import build_request
from warmer.core.agents import AgentSpec, DynamicTail, Placeholder, StaticBlock, substitute
from warmer.core.errors import ConfigError

GOOD_SPEC = """
model = "tiny-demo"
tools_file = "tools.json"

[[blocks]]
name = "persona"
text = "You are Maya."

[[blocks]]
name = "rules"
file = "rules.md"

[dynamic]
template = "Customer: {customer_name}"

[placeholders]
customer_name = "name"
"""


def _write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def agents_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "agents"
    directory.mkdir()
    _write(directory, "rules.md", "Be brief.\nNever promise discounts.\n")
    _write(directory, "tools.json", json.dumps([tool("end_call")]))
    return directory


def test_shipped_examples_load_with_files_resolved() -> None:
    specs = load_agent_specs(AGENTS_DIR)
    assert set(specs) == {"outbound-sales", "outbound-sales-early"}
    fixed = specs["outbound-sales"]
    assert [b.name for b in fixed.blocks] == ["persona", "rules", "call-flow", "reference", "examples"]
    assert fixed.blocks[1].text == (AGENTS_DIR / "outbound-sales" / "rules.md").read_text()
    names = [json.dumps(t["function"]).split('"name": ')[1].split(",")[0] for t in fixed.tools]
    assert names == ['"send_offer_link"', '"schedule_callback"', '"end_call"']
    assert fixed.model == "tiny-demo"
    assert set(fixed.placeholder_names) == {
        "customer_name",
        "current_plan",
        "customer_phone",
        "now",
        "call_id",
    }
    assert fixed.placeholder("current_plan").samples == ("Basic, 20 GB", "Plus, 60 GB", "Family, four lines")


def test_good_file_loads(agents_dir: Path) -> None:
    _write(agents_dir, "sales.toml", GOOD_SPEC)
    (loaded,) = load_agent_specs(agents_dir).values()
    assert loaded.id == "sales"
    assert loaded.blocks[1] == StaticBlock(
        "rules", "Be brief.\nNever promise discounts.\n", source="rules.md"
    )
    assert loaded.tail == DynamicTail("Customer: {customer_name}", "user", "message")


def test_every_problem_is_reported_with_file_and_field(agents_dir: Path) -> None:
    _write(
        agents_dir,
        "sales.toml",
        GOOD_SPEC.replace('file = "rules.md"', 'file = "missing.md"').replace(
            "You are Maya.", "You are Maya. Hi {caller}."
        )
        + '\n[[blocks]]\nname = "extra"\nfile = "nope.md"\n',
    )
    _write(
        agents_dir,
        "bad-tools.toml",
        GOOD_SPEC.replace('tools_file = "tools.json"', 'tools_file = "absent.json"'),
    )
    with pytest.raises(ConfigError) as caught:
        load_agent_specs(agents_dir)
    problems = dict(caught.value.problems)
    assert problems["agents/sales.toml: blocks[1].file"] == "not found: missing.md"
    assert problems["agents/sales.toml: blocks[2].file"] == "not found: nope.md"
    assert problems["agents/bad-tools.toml: tools_file"] == "not found: absent.json"
    assert "agents/sales.toml: blocks[1].file: not found: missing.md" in str(caught.value)


def test_unknown_placeholder_names_block_and_line(agents_dir: Path) -> None:
    _write(agents_dir, "sales.toml", GOOD_SPEC.replace("You are Maya.", "You are Maya.\\nHi {caller}."))
    with pytest.raises(ConfigError) as caught:
        load_agent_specs(agents_dir)
    ((path, message),) = caught.value.problems
    assert path == "agents/sales.toml: blocks[0] (persona) line 2"
    assert "unknown placeholder {caller}" in message


def test_unknown_placeholder_in_tail_and_unused_declaration(agents_dir: Path) -> None:
    text = GOOD_SPEC.replace("Customer: {customer_name}", "Customer: {customer}")
    _write(agents_dir, "sales.toml", text)
    with pytest.raises(ConfigError) as caught:
        load_agent_specs(agents_dir)
    problems = dict(caught.value.problems)
    assert "unknown placeholder {customer}" in problems["agents/sales.toml: dynamic.template line 1"]
    assert problems["agents/sales.toml: placeholders.customer_name"] == "declared but never used"


@pytest.mark.parametrize(
    ("tools", "path", "fragment"),
    [
        (
            [{"type": "fn", "function": {"name": "a", "parameters": {"type": "object"}}}],
            "tools[0].type",
            "function",
        ),
        (
            [{"type": "function", "function": {"parameters": {"type": "object"}}}],
            "tools[0].function.name",
            "1-64",
        ),
        (
            [{"type": "function", "function": {"name": "a b", "parameters": {"type": "object"}}}],
            "tools[0].function.name",
            "1-64",
        ),
        ([{"type": "function", "function": {"name": "a"}}], "tools[0].function.parameters", "JSON-schema"),
        (
            [{"type": "function", "function": {"name": "a", "parameters": {"type": "string"}}}],
            "tools[0].function.parameters.type",
            "object",
        ),
        ([tool("a"), tool("a")], "tools", "duplicate tool name 'a'"),
        ([{"type": "function"}], "tools[0].function", "missing"),
    ],
)
def test_invalid_tools(agents_dir: Path, tools: list[object], path: str, fragment: str) -> None:
    _write(agents_dir, "tools.json", json.dumps(tools))
    _write(agents_dir, "sales.toml", GOOD_SPEC)
    with pytest.raises(ConfigError) as caught:
        load_agent_specs(agents_dir)
    problems = dict(caught.value.problems)
    assert fragment in problems[f"agents/sales.toml: {path}"]


def test_top_level_key_after_blocks_gets_a_toml_hint(agents_dir: Path) -> None:
    text = (
        GOOD_SPEC.replace('tools_file = "tools.json"\n', "")
        + '\n[[blocks]]\nname = "x"\ntext = "y"\ntools_file = "tools.json"\n'
    )
    _write(agents_dir, "sales.toml", text)
    with pytest.raises(
        ConfigError, match=r"blocks\[2\]: unknown keys: tools_file \(top-level keys must come before"
    ):
        load_agent_specs(agents_dir)


def test_samples_must_differ_in_their_first_character(agents_dir: Path) -> None:
    _write(
        agents_dir,
        "sales.toml",
        GOOD_SPEC + '\n[samples]\ncustomer_name = ["Ana", "Anna"]\nghost = ["a", "b"]\n',
    )
    with pytest.raises(ConfigError) as caught:
        load_agent_specs(agents_dir)
    problems = dict(caught.value.problems)
    assert "start differently" in problems["agents/sales.toml: samples.customer_name"]
    assert "undeclared" in problems["agents/sales.toml: samples.ghost"]


def test_invalid_toml_and_missing_dir(agents_dir: Path, tmp_path: Path) -> None:
    _write(agents_dir, "broken.toml", "model = \n")
    with pytest.raises(ConfigError, match=r"agents/broken.toml: invalid TOML"):
        load_agent_specs(agents_dir)
    with pytest.raises(ConfigError, match="agents directory not found"):
        load_agent_specs(tmp_path / "nowhere")


def test_spec_hash_tracks_content_not_location() -> None:
    a = spec()
    assert a.spec_hash == spec().spec_hash
    moved = AgentSpec(a.id, a.model, a.blocks, a.tail, a.placeholders, source="elsewhere.toml")
    assert moved.spec_hash == a.spec_hash
    assert spec(blocks=(("persona", "You are Sam."),)).spec_hash != a.spec_hash
    assert spec(tools=(tool("end_call"),)).spec_hash != a.spec_hash
    assert len({spec(tools=(tool("end_call"),)), spec(tools=(tool("end_call"),)), a}) == 2  # usable as keys


def test_escaped_braces_are_literal_and_json_is_left_alone() -> None:
    agent = spec(blocks=(("persona", 'Say {{customer_name}} literally. Reply {"ok": true}.'),))
    assert "customer_name" not in {s for s in agent.placeholder_names if s != "customer_name"}
    system = build_request(agent, {"customer_name": "Ana", "now": "x"}).messages[0]["content"]
    assert system == 'Say {customer_name} literally. Reply {"ok": true}.'
    assert substitute("{a} {{a}} {b}", {"a": "1"}) == "1 {a} {b}"


def test_placeholder_kinds_are_validated() -> None:
    with pytest.raises(ConfigError, match=r"placeholders.x.kind: unknown kind 'color'"):
        spec(tail="{x}", placeholders=(Placeholder("x", "color"),))


# --- the offline tokenizer file matches the generated engine model ----------------------------------------


def test_committed_tokenizer_file_is_the_generated_one() -> None:
    committed = json.loads((MODELS_DIR / "tiny-demo.tokenizer.json").read_text())
    assert committed == json.loads(byte_spm_tokenizer().to_str())


def test_tokenizer_matches_the_gguf_vocabulary_and_llama_cpp_spm_rules() -> None:
    profile = load_profile(MODELS_DIR / "tiny-demo.toml")
    tokenize = offline_tokenizer(profile)
    space = [byte_token_id(b) for b in "\u2581".encode()]
    assert tokenize("Hi") == [BOS_ID, *space, byte_token_id(ord("H")), byte_token_id(ord("i"))]
    # llama.cpp adds the space prefix again after every special token (`is_prev_special`).
    assert tokenize("<|im_start|>a<|im_end|>") == [
        BOS_ID,
        IM_START_ID,
        *space,
        byte_token_id(ord("a")),
        IM_END_ID,
    ]
    assert isinstance(load_tokenizer(MODELS_DIR / "tiny-demo.tokenizer.json"), FileTokenizer)


def test_unloadable_tokenizer_file_is_a_config_error(tmp_path: Path) -> None:
    bad = _write(tmp_path, "tok.json", "{not json")
    with pytest.raises(ConfigError, match="tokenizer_file: cannot load"):
        load_tokenizer(bad)
