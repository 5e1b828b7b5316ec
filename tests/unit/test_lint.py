"""Lint: where the first per-call value sits and what it costs; per-call-looking literals; drift; CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from sarif_pydantic import Sarif

from tests.unit.prompt_helpers import (
    AGENTS_DIR,
    MODELS_DIR,
    REPO,
    byte_tokenize,
    chatml,
    spec,
    tool,
    word_tokenize,
)
from tests.unit.test_prefix import TOOLS_AFTER_SYSTEM
from warmer.cli import main
from warmer.cli.exits import Exit
from warmer.cli.lint import lint_command
from warmer.cli.prompts import PROMPT_TOOLS_KEY, render_command
from warmer.config.agents import load_agent_specs
from warmer.core.agents import AgentSpec, FewShotMessage
from warmer.core.chat_template import ChatTemplate
from warmer.core.lint import Finding, SpecPlace, lint_agent, looks_per_call, scan_static_text
from warmer.core.lint_report import (
    FileLine,
    LocatedFinding,
    github_annotations,
    locate,
    locate_finding,
    sarif_log,
)
from warmer.core.model import ModelProfile, prefix_hash
from warmer.core.prefix import RenderFn, TokenizeFn, compute_stable_prefix
from warmer.core.tokenizer_drift import TokenCountObservation, detect_tokenizer_drift

REQUIRED_JSON_KEYS = (
    "agent",
    "stable_prefix_tokens",
    "turn1_prompt_tokens",
    "stable_share",
    "first_dynamic_token_offset",
    "findings",
)
DIRS = ["--agents-dir", str(AGENTS_DIR), "--models-dir", str(MODELS_DIR)]


@pytest.fixture(scope="module")
def examples() -> dict[str, object]:
    return dict(load_agent_specs(AGENTS_DIR))


def test_early_value_reports_position_cost_and_advice() -> None:
    persona = "You are Maya.\nToday is {now} and you call {customer_name}.\n" + "Be kind and brief. " * 30
    agent = spec(blocks=(("persona", persona),), tail="Customer: {customer_name}")
    result = lint_agent(agent, chatml, byte_tokenize)

    assert result.first_dynamic_placeholder == "now"
    assert result.first_dynamic_location == "block 'persona' line 2"
    stable = compute_stable_prefix(agent, chatml, byte_tokenize)
    assert (
        result.first_dynamic_token_offset == stable.first_dynamic_token_offset == result.stable_prefix_tokens
    )
    assert result.stable_prefix_tokens == len(
        byte_tokenize("<|im_start|>system\nYou are Maya.\nToday is ")
    )  # the space is 3 byte tokens
    assert result.ideal_stable_tokens > result.stable_prefix_tokens + 600
    assert result.wasted_tokens_per_call == result.ideal_stable_tokens - result.stable_prefix_tokens
    advice = {f.advice for f in result.findings if f.code == "early-per-call-value"}
    assert advice == {"move {now} from block 'persona' line 2 to the dynamic tail"}
    static = [f for f in result.findings if f.code == "per-call-value-in-static-text"]
    assert [f.location for f in static] == ["block 'persona' line 2", "block 'persona' line 2"]
    assert "the dynamic tail already has it" in next(
        f.advice for f in static if "{customer_name}" in f.message
    )


def test_good_layout_has_no_findings_and_ideal_share() -> None:
    agent = spec(blocks=(("persona", "You are Maya.\n" + "Be kind and brief. " * 30),))
    result = lint_agent(agent, chatml, byte_tokenize)
    assert result.findings == ()
    assert result.wasted_tokens_per_call == 0
    assert result.stable_share == result.ideal_share > 0.8


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("Campaign started 2026-11-28.", "date"),
        ("Valid until 31/12/2026.", "date"),
        ("Offer ends March 3, 2026.", "date"),
        ("It is 14:05 now.", "time"),
        ("Call back at 9:30 am.", "time"),
        ("Reach us on +1 212 555 0147.", "phone"),
        ("Session 3f2b8c1e-8e0a-4d5c-9a55-0b9f6a1d2c3e.", "uuid"),
        ("Ticket ORD-48213 is open.", "id"),
        ("Balance due: $42.50 today.", "amount"),
    ],
)
def test_per_call_looking_values_are_flagged(text: str, kind: str) -> None:
    assert [k for k, _, _ in looks_per_call(text)] == [kind]


@pytest.mark.parametrize(
    "text",
    [
        "Support runs every day from 8 am to 8 pm.",
        "Plus has 60 GB for $25 per month.",
        "Step 1. Greet the customer. Step 2. Ask one question.",
        'Reply with {"ok": true} only.',
        "Four lines share 200 GB.",
    ],
)
def test_static_facts_are_not_flagged(text: str) -> None:
    assert looks_per_call(text) == []


def test_scan_reports_block_and_line() -> None:
    agent = spec(
        blocks=(("persona", "You are Maya."), ("reference", "Plans:\nPromo code valid until 2026-12-31."))
    )
    (finding,) = scan_static_text(agent)
    assert finding.code == "looks-per-call-date"
    assert finding.location == "block 'reference' line 2"


def test_shipped_examples_early_vs_fixed(examples: dict[str, object]) -> None:
    early = lint_agent(examples["outbound-sales-early"], chatml, byte_tokenize)  # type: ignore[arg-type]
    fixed = lint_agent(examples["outbound-sales"], chatml, byte_tokenize)  # type: ignore[arg-type]

    assert early.first_dynamic_location == "block 'persona' line 1"
    assert early.first_dynamic_placeholder == "now"
    assert early.stable_share < 0.05
    assert early.wasted_tokens_per_call > 2000
    assert fixed.turn1_prompt_tokens > 2000
    assert fixed.stable_share == fixed.ideal_share > 0.9
    assert fixed.first_dynamic_location == "the dynamic tail line 2"
    assert [f.code for f in fixed.findings] == []


# --- tokenizer drift --------------------------------------------------------------------------------------


def _obs(
    count: int, version: str, *, model: str = "m", text: str = "prefix", at: float = 0.0
) -> TokenCountObservation:
    return TokenCountObservation(prefix_hash(text), model, version, count, at)


def test_drift_after_an_upgrade_is_flagged() -> None:
    history = [_obs(1000, "v1", at=1.0), _obs(1010, "v1.5", at=2.0)]
    finding = detect_tokenizer_drift(history, _obs(1091, "v2", at=3.0))
    assert finding is not None
    assert finding.code == "tokenizer-drift"
    assert "+8.0%" in finding.message
    assert "v1.5" in finding.message  # compared with the latest earlier version


@pytest.mark.parametrize(
    "current",
    [
        _obs(1040, "v2"),  # 4% < 5% threshold
        _obs(1200, "v1"),  # same engine version: not an upgrade
        _obs(1200, "v2", model="other"),  # another model
        _obs(1200, "v2", text="other prefix"),  # another prefix
    ],
)
def test_no_drift(current: TokenCountObservation) -> None:
    assert detect_tokenizer_drift([_obs(1000, "v1")], current) is None


def test_drift_threshold_is_configurable_and_symmetric() -> None:
    assert detect_tokenizer_drift([_obs(1000, "v1")], _obs(970, "v2"), threshold=0.02) is not None
    assert detect_tokenizer_drift([_obs(1000, "v1")], _obs(970, "v2")) is None


def test_observation_keys_on_text_not_token_ids() -> None:
    stable = compute_stable_prefix(spec(), chatml, byte_tokenize)
    observation = TokenCountObservation.of(stable, "v1")
    assert observation.text_hash == prefix_hash(stable.text)
    assert observation.text_hash != stable.hash  # the id-based hash would change with the tokenizer


# --- CLI ----------------------------------------------------------------------------------------------------


def test_cli_lint_json_fails_the_early_layout_under_min_share() -> None:
    result = CliRunner().invoke(lint_command, [*DIRS, "--json", "--min-share", "0.8"])
    assert result.exit_code == 1, result.output
    rows = {row["agent"]: row for row in json.loads(result.output)}
    assert set(rows) == {"outbound-sales", "outbound-sales-early"}
    for row in rows.values():
        assert set(REQUIRED_JSON_KEYS) <= set(row)
    early, fixed = rows["outbound-sales-early"], rows["outbound-sales"]
    assert early["below_min_share"]
    assert not fixed["below_min_share"]
    assert early["first_dynamic_location"] == "block 'persona' line 1"
    assert early["first_dynamic_token_offset"] == early["stable_prefix_tokens"] < 40
    assert "early-per-call-value" in {f["code"] for f in early["findings"]}
    assert fixed["stable_share"] == pytest.approx(fixed["ideal_share"])
    assert fixed["stable_share"] > 0.9


def test_cli_lint_passes_the_fixed_layout_alone() -> None:
    result = CliRunner().invoke(lint_command, ["outbound-sales", *DIRS, "--min-share", "0.8"])
    assert result.exit_code == 0, result.output
    assert "outbound-sales (tiny-demo):" in result.output
    assert "FAIL" not in result.output


def test_cli_lint_text_names_position_and_advice() -> None:
    result = CliRunner().invoke(lint_command, ["outbound-sales-early", *DIRS, "--report-only"])
    assert result.exit_code == 0, result.output  # report only: the error findings do not fail the run
    assert "first per-call value at token" in result.output
    assert "move {now} from block 'persona' line 1 to the dynamic tail" in result.output
    assert "FAIL" not in result.output


def test_cli_render_json_is_the_exact_prefix() -> None:
    result = CliRunner().invoke(render_command, ["outbound-sales", *DIRS, "--format", "json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert body["token_ids"] == byte_tokenize(body["text"])
    assert body["token_count"] == len(body["token_ids"])
    assert body["prefix_hash"] == prefix_hash(body["text"], tuple(body["token_ids"]))
    assert body["text"].startswith("<|im_start|>system\nYou are Maya")
    assert body["text"].endswith("Call details\nCustomer: ")


def test_cli_render_text_and_unknown_agent() -> None:
    result = CliRunner().invoke(render_command, ["outbound-sales", *DIRS])
    assert result.exit_code == 0
    assert "<|im_start|>system\nYou are Maya" in result.output
    missing = CliRunner().invoke(render_command, ["nobody", *DIRS])
    assert missing.exit_code == Exit.CONFIG
    assert "unknown agent 'nobody'" in missing.output


def test_cli_is_registered_and_uses_the_group_config() -> None:
    args = ["--config", str(REPO / "config" / "example.toml"), "lint", "--json", "--report-only"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert {row["agent"] for row in json.loads(result.output)} == {"outbound-sales", "outbound-sales-early"}


def test_cli_render_uses_injected_engine_tools() -> None:
    """The seam for engine-backed rendering: a factory in ctx.meta replaces the offline template/tokenizer."""
    seen: list[str] = []

    def engine_tools(profile: ModelProfile) -> tuple[RenderFn, TokenizeFn]:
        seen.append(profile.name)
        return chatml, word_tokenize

    @click.group()
    @click.pass_context
    def shell(ctx: click.Context) -> None:
        ctx.meta[PROMPT_TOOLS_KEY] = engine_tools

    shell.add_command(render_command)
    result = CliRunner().invoke(shell, ["render", "outbound-sales", *DIRS, "--format", "json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert seen == ["tiny-demo"]
    assert body["token_ids"] == word_tokenize(body["text"])
    assert body["text"].endswith("Customer:")  # word tokens: the space belongs to the name


# --- repeated heuristic warnings ------------------------------------------------------------------------


def test_a_table_of_opening_hours_is_one_warning_with_a_count_and_the_first_places() -> None:
    days = ("Mon", "Tue", "Wed", "Thu", "Fri")
    table = "\n".join(f"Store {i} {days[i % 5]}: opens 09:{i % 60:02d}" for i in range(45))
    agent = spec(blocks=(("persona", "You are Maya."), ("reference", "Opening hours:\n" + table)))

    findings = [
        f for f in lint_agent(agent, chatml, byte_tokenize).findings if f.code == "looks-per-call-time"
    ]

    assert len(findings) == 1
    (finding,) = findings
    assert finding.count == 45
    assert [p.describe() for p in finding.places] == [f"block 'reference' line {n}" for n in (2, 3, 4)]
    assert finding.location == "block 'reference' line 2"
    assert "45 values" in finding.message
    assert "'09:00' (block 'reference' line 2)" in finding.message
    assert "and 42 more" in finding.message


def test_one_per_call_looking_value_keeps_its_single_message() -> None:
    agent = spec(blocks=(("persona", "You are Maya."), ("reference", "It is 14:05 now.")))
    (finding,) = scan_static_text(agent)
    assert finding.count == 1
    assert finding.message == "time '14:05' in static text looks like a per-call value"


# --- where the dynamic tail is rendered -----------------------------------------------------------------


def _tools_after_system() -> ChatTemplate:
    return ChatTemplate(TOOLS_AFTER_SYSTEM)


def test_system_end_tail_before_the_tools_reports_their_cost_and_an_own_message() -> None:
    template = _tools_after_system()
    tools = (tool("send_offer_link", "Send the offer link. " * 20), tool("end_call"))
    agent = spec(tools=tools, placement="system_end")
    as_message = spec(tools=tools, placement="message")

    result = lint_agent(agent, template, byte_tokenize)
    fixed = compute_stable_prefix(as_message, template, byte_tokenize)

    assert result.tool_tokens > 900
    assert result.ideal_placement == "message"
    assert result.ideal_stable_tokens == fixed.token_count  # the ideal is the tail as its own message
    assert (
        result.wasted_tokens_per_call == fixed.token_count - result.stable_prefix_tokens > result.tool_tokens
    )
    (finding,) = [f for f in result.findings if f.code == "tools-after-dynamic-tail"]
    assert f"({result.tool_tokens} tokens)" in finding.message
    assert 'placement = "message"' in finding.advice
    assert f"{result.wasted_tokens_per_call} more tokens per call" in finding.advice
    assert [p.where for p in finding.places] == ["dynamic.placement"]


def test_a_value_in_static_text_and_in_a_system_end_tail_is_dropped_not_moved() -> None:
    """The field case: lint said '40 wasted tokens, move {now} to the tail' while the tail already had it
    and every tool sat behind that tail."""
    template = _tools_after_system()
    tools = (tool("send_offer_link", "Send the offer link. " * 20), tool("end_call"))
    agent = spec(
        blocks=(("persona", "You are Maya.\nBe kind. It is {now}."),), tools=tools, placement="system_end"
    )

    result = lint_agent(agent, template, byte_tokenize)

    codes = [f.code for f in result.findings]
    assert "tools-after-dynamic-tail" in codes
    assert "tools-after-dynamic-value" not in codes  # moving {now} into the tail would not reach the tools
    assert result.wasted_tokens_per_call > result.tool_tokens > 900
    for f in result.findings:
        assert "to the dynamic tail" not in f.advice, f
    static = next(f for f in result.findings if f.code == "per-call-value-in-static-text")
    assert static.advice.startswith("drop {now} from block 'persona' line 2: the dynamic tail already has it")
    early = next(f for f in result.findings if f.code == "early-per-call-value")
    assert 'placement = "message"' in early.advice


def test_a_system_end_tail_with_nothing_after_it_wastes_nothing() -> None:
    agent = spec(tools=(tool("end_call"),), placement="system_end")  # ChatML renders no tools
    result = lint_agent(agent, chatml, byte_tokenize)
    assert result.findings == ()
    assert result.wasted_tokens_per_call == 0
    assert result.ideal_placement == "system_end"
    assert result.tool_tokens == 0


def test_few_shot_messages_behind_a_system_end_tail_are_reported() -> None:
    base = spec(placement="system_end")
    agent = dataclasses.replace(
        base, few_shot=(FewShotMessage("user", "Hi, who is this?"), FewShotMessage("assistant", "Maya here."))
    )
    result = lint_agent(agent, chatml, byte_tokenize)
    (finding,) = result.findings
    assert finding.code == "few-shot-after-dynamic-tail"
    assert result.ideal_placement == "message"
    assert result.wasted_tokens_per_call > len(byte_tokenize("Hi, who is this?"))


def test_tools_after_a_static_value_cost_is_reported() -> None:
    template = _tools_after_system()
    agent = spec(blocks=(("persona", "You are Maya. Call {customer_name}."),), tools=(tool("end_call"),))
    result = lint_agent(agent, template, byte_tokenize)
    (finding,) = [f for f in result.findings if f.code == "tools-after-dynamic-value"]
    assert f"({result.tool_tokens} tokens)" in finding.message
    assert result.tool_tokens > 0
    assert finding.advice.startswith("drop {customer_name}")  # the tail has it too


# --- gating: exit codes -----------------------------------------------------------------------------------


def test_cli_lint_fails_on_error_findings_unless_report_only() -> None:
    failing = CliRunner().invoke(lint_command, ["outbound-sales-early", *DIRS])
    assert failing.exit_code == 1, failing.output
    assert "FAIL outbound-sales-early: 3 error-level finding(s)" in failing.output
    clean = CliRunner().invoke(lint_command, ["outbound-sales", *DIRS])
    assert clean.exit_code == 0, clean.output


def test_cli_report_only_keeps_the_min_share_gate() -> None:
    result = CliRunner().invoke(lint_command, [*DIRS, "--report-only", "--min-share", "0.8"])
    assert result.exit_code == 1, result.output
    assert "FAIL outbound-sales-early: stable share" in result.output
    assert "error-level finding" not in result.output


def test_cli_json_and_another_format_disagree() -> None:
    result = CliRunner().invoke(lint_command, [*DIRS, "--json", "--format", "sarif"])
    assert result.exit_code == 2
    assert "--json and --format sarif disagree" in result.output


# --- SARIF and GitHub annotations --------------------------------------------------------------------------


def _check_sarif(log: object) -> None:
    """A SARIF 2.1.0 log as the `sarif-pydantic` object model reads it (every field it knows typed and
    named right), with the version and schema reference code scanning looks for."""
    assert isinstance(log, dict)
    assert log["version"] == "2.1.0"
    assert str(log["$schema"]).endswith("sarif-schema-2.1.0.json")
    parsed = Sarif.model_validate(log)
    assert parsed.runs
    for run in parsed.runs:
        assert run.tool.driver.name
        for result in run.results or ():
            assert result.message.text
            for location in result.locations or ():
                assert location.physical_location is not None
                assert location.physical_location.artifact_location is not None


def test_cli_sarif_is_valid_sarif_and_points_at_the_spec_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    result = CliRunner().invoke(lint_command, [*DIRS, "--format", "sarif", "--min-share", "0.8"])
    assert result.exit_code == 1, result.output
    log = json.loads(result.output)

    _check_sarif(log)
    (run,) = log["runs"]
    rule_ids = [rule["id"] for rule in run["tool"]["driver"]["rules"]]
    results = run["results"]
    assert (
        {r["ruleId"] for r in results}
        == set(rule_ids)
        == {
            "per-call-value-in-static-text",
            "early-per-call-value",
            "below-min-share",
        }
    )
    for r in results:
        assert rule_ids[r["ruleIndex"]] == r["ruleId"]
        assert r["level"] == "error"
        assert r["properties"]["agent"] == "outbound-sales-early"
    early = next(r for r in results if r["ruleId"] == "early-per-call-value")
    where = early["locations"][0]["physicalLocation"]
    uri, line = where["artifactLocation"]["uri"], where["region"]["startLine"]
    assert uri == "config/agents/outbound-sales-early.toml"
    assert "{now}" in (REPO / uri).read_text().split("\n")[line - 1]


def test_sarif_lists_the_further_places_of_a_grouped_warning() -> None:
    table = "\n".join(f"Desk {i}: opens 09:{i:02d}" for i in range(6))
    agent = spec(blocks=(("reference", table),))
    (finding,) = scan_static_text(agent)
    item = locate_finding(agent, finding, lambda _: None)
    log = sarif_log([item], tool_version="0")
    _check_sarif(log)
    (result,) = log["runs"][0]["results"]  # type: ignore[index]
    assert result["properties"]["count"] == 6
    assert len(result["relatedLocations"]) == 2


def test_github_annotations_escape_like_the_actions_toolkit() -> None:
    """actions/toolkit packages/core/src/command.ts @ 4b9afa4c: data escapes % CR LF; properties also : ,"""
    finding = Finding("looks-per-call-time", "warning", "50% at 9:30,\nthen", location="x")
    item = LocatedFinding("a,b", finding, (FileLine("dir:x/spec.toml", 7),))
    (line,) = github_annotations([item])
    assert line == (
        "::warning file=dir%3Ax/spec.toml,line=7,title=warmer lint looks-per-call-time (a%2Cb)"
        "::a,b: 50%25 at 9:30,%0Athen"
    )


def test_cli_github_annotations_point_at_the_spec_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    result = CliRunner().invoke(lint_command, [*DIRS, "--format", "github"])
    assert result.exit_code == 1
    lines = result.output.strip().split("\n")
    assert len(lines) == 3
    assert all(ln.startswith("::error file=config/agents/outbound-sales-early.toml,line=10,") for ln in lines)


def test_cli_formats_outside_the_repository_use_absolute_paths(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    spec_file = (AGENTS_DIR / "outbound-sales-early.toml").resolve()
    github = CliRunner().invoke(lint_command, [*DIRS, "--format", "github"])
    assert github.output.startswith(f"::error file={spec_file.as_posix()},line=10,")
    sarif = json.loads(CliRunner().invoke(lint_command, [*DIRS, "--format", "sarif"]).output)
    where = sarif["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert where["uri"] == spec_file.as_uri()


def test_locate_follows_included_files_the_tail_and_fields(examples: dict[str, object]) -> None:
    early = examples["outbound-sales-early"]
    assert isinstance(early, AgentSpec)

    def read(path: str) -> str | None:
        return (REPO / path).read_text() if (REPO / path).is_file() else None

    rules = locate(early, SpecPlace("block", "reference", 4), read)
    assert rules.path.endswith("outbound-sales/reference.md")
    assert rules.line == 4
    source = Path(early.source).read_text().split("\n")
    tail = locate(early, SpecPlace("tail", "dynamic.template", 3), lambda p: Path(p).read_text())
    assert source[tail.line - 1].startswith("Phone: {customer_phone}")
    field_line = locate(early, SpecPlace("field", "dynamic.role"), lambda p: Path(p).read_text())
    assert source[field_line.line - 1].startswith("role =")
    assert locate(early, SpecPlace("spec"), lambda p: None).line == 1
