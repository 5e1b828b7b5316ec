"""`warmer hitrate --calls`: the generated call log of `tests.call_log_world` reported figure by figure.

Every expected figure is derived from the world's constants (how many first turns are warm, what they
cache, how long the prompts are), never read back from the report.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests.call_log_world import (
    EXAMPLE_LOG,
    OPENAI_STEP,
    RENEWALS,
    SALES,
    SUPPORT,
    WORLD,
    WorldAgent,
    jsonl,
    records,
)
from warmer.cli import main
from warmer.cli.exits import Exit
from warmer.config.loader import load_config
from warmer.config.tokenizer import offline_renderer, offline_tokenizer
from warmer.core.agents import AgentSpec
from warmer.core.prefix import compute_stable_prefix

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def report_of(path: Path = EXAMPLE_LOG, *extra: str) -> dict[str, Any]:
    result = run("hitrate", "--calls", str(path), "--json", *extra)
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.output)
    return data


def turn1_rate(*agents: WorldAgent) -> float:
    cached = sum(a.warm_first_turns * a.turn1_cached_when_warm for a in agents)
    return cached / sum(a.calls * a.turn1_prompt for a in agents)


def test_the_shipped_example_is_the_generated_world() -> None:
    assert EXAMPLE_LOG.read_text() == jsonl(), "regenerate it: python -m tests.call_log_world"


def test_turn1_hit_rate_and_the_outbound_inbound_gap() -> None:
    data = report_of()
    assert data["turn1"]["requests"] == sum(a.calls for a in WORLD)
    assert data["turn1"]["hit_rate"] == pytest.approx(turn1_rate(*WORLD))
    groups = {g["group"]: g for g in data["by_group"]}
    assert groups["outbound"]["turn1"]["hit_rate"] == pytest.approx(turn1_rate(SALES, RENEWALS))
    assert groups["inbound"]["turn1"]["hit_rate"] == pytest.approx(turn1_rate(SUPPORT))
    assert groups["inbound"]["turn1"]["hit_rate"] - groups["outbound"]["turn1"]["hit_rate"] > 0.5


def test_hit_rate_by_turn_index_and_by_turns_in_the_call() -> None:
    data = report_of()
    by_turn = {row["label"]: row for row in data["by_turn"]}
    assert list(by_turn) == ["1", "2", "3", "4+"]
    assert by_turn["1"]["hit_rate"] == pytest.approx(turn1_rate(*WORLD))
    # Later turns reuse their own call: every one of them is over 90% whatever turn 1 did.
    assert all(by_turn[k]["hit_rate"] > 0.9 for k in ("2", "3", "4+"))
    calls_of_length = {
        n: sum(1 for a in WORLD for i in range(a.calls) if min(a.turns(i), 4) == n) for n in (1, 2, 3, 4)
    }
    by_length = {row["label"]: row for row in data["by_turns_in_call"]}
    assert [by_length[k]["calls"] for k in ("1", "2", "3", "4+")] == [
        calls_of_length[n] for n in (1, 2, 3, 4)
    ]
    rates = [by_length[k]["hit_rate"] for k in ("1", "2", "3", "4+")]
    assert rates == sorted(rates), "the field report's upward line: longer calls amortise their cold turn 1"


def test_the_1024_spike_is_called_out_with_what_it_means() -> None:
    data = report_of()
    spikes = {s["agent"]: s for s in data["distribution"]["spikes"]}
    sales = spikes[SALES.agent]
    assert (sales["cached_tokens"], sales["count"], sales["suspicious"]) == (
        1024,
        SALES.warm_first_turns,
        True,
    )
    assert sales["cached_fraction_of_prompt"] == pytest.approx(1024 / SALES.turn1_prompt)
    assert sales["step"] == OPENAI_STEP
    assert "first per-call value sits between token 1,024 and 1,152" in sales["meaning"]
    assert "smallest prefix OpenAI and Anthropic cache" in sales["meaning"]
    # The healthy agents' dominant values are their whole stable prefixes, not spikes.
    assert spikes[SUPPORT.agent]["suspicious"] is False
    assert spikes[RENEWALS.agent]["suspicious"] is False
    top = {v["cached_tokens"]: v["count"] for v in data["distribution"]["top_values"]}
    assert top[1024] == SALES.warm_first_turns
    assert top[0] == sum(a.calls - a.warm_first_turns for a in WORLD)


def test_depth_problem_on_one_agent_coverage_problem_on_another() -> None:
    agents = {a["agent"]: a for a in report_of()["agents"]}
    sales, renewals, support = agents[SALES.agent], agents[RENEWALS.agent], agents[SUPPORT.agent]
    assert sales["problem"] == "depth"
    assert sales["depth"] == pytest.approx(1024 / SALES.turn1_prompt)
    assert sales["coverage"] == pytest.approx(SALES.warm_first_turns / SALES.calls)
    assert renewals["problem"] == "coverage"
    assert renewals["depth"] == pytest.approx(RENEWALS.turn1_cached_when_warm / RENEWALS.turn1_prompt)
    assert renewals["coverage"] == pytest.approx(RENEWALS.warm_first_turns / RENEWALS.calls)
    assert support["problem"] == "ok"
    assert {a["depth_source"] for a in agents.values()} == {"log"}
    for agent, world in ((sales, SALES), (renewals, RENEWALS), (support, SUPPORT)):
        assert agent["turn1_hit_rate"] == pytest.approx(agent["depth"] * agent["coverage"])
        assert agent["turn1_hit_rate"] == pytest.approx(turn1_rate(world))


def pct(value: float) -> str:
    return re.escape(f"{value:.1%}")


def test_the_table_says_each_finding() -> None:
    result = run("hitrate", "--calls", str(EXAMPLE_LOG))
    assert result.exit_code == 0, result.output
    out = result.output
    assert re.search(rf"^turn-1 hit rate: {pct(turn1_rate(*WORLD))}", out, re.M)
    assert re.search(rf"^  inbound +{SUPPORT.calls} +{pct(turn1_rate(SUPPORT))}", out, re.M)
    outbound = SALES.calls + RENEWALS.calls
    assert re.search(rf"^  outbound +{outbound} +{pct(turn1_rate(SALES, RENEWALS))}", out, re.M)
    warm = SALES.warm_first_turns
    spike = rf"^SPIKE: outbound-sales: {warm} of {warm} turn-1 hits \(100%\) reused exactly 1,024 tokens"
    assert re.search(spike, out, re.M)
    for agent, problem in ((SALES, "depth"), (RENEWALS, "coverage"), (SUPPORT, "ok")):
        depth = agent.turn1_cached_when_warm / agent.turn1_prompt
        coverage = agent.warm_first_turns / agent.calls
        row = (
            rf"^  {agent.agent} +{agent.calls} +{pct(turn1_rate(agent))} +{pct(depth)} +log "
            rf"+{pct(coverage)}  {problem}$"
        )
        assert re.search(row, out, re.M), row


def test_csv_reads_like_the_json_lines(tmp_path: Path) -> None:
    """A CSV export with the API's field names as dotted headers gives the same report."""
    path = tmp_path / "calls.csv"
    headers = ["call_id", "turn", "direction", "agent"]
    rows = []
    for record in records():
        row = {k: str(record[k]) for k in headers}
        usage = record["usage"]
        assert isinstance(usage, dict)
        for key, value in usage.items():
            if isinstance(value, dict):
                row.update({f"usage.{key}.{k}": str(v) for k, v in value.items()})
            else:
                row[f"usage.{key}"] = str(value)
        rows.append(row)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns)
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(buffer.getvalue())
    assert report_of(path) == report_of()


@pytest.mark.parametrize(
    ("content", "where"),
    [
        (
            '{"call_id": "a", "turn": 1, "usage": {"prompt_tokens": 10}}\n{"call_id": "b", "turn": 1}\n',
            ":2: usage: missing",
        ),
        ('{"call_id": "a", "turn": 1, "usage": {"prompt_tokens": 10}}\n\n{"call_id": ', ":3: not JSON"),
        ("[1, 2]\n", ":1: a record must be a JSON object"),
        ('{"call_id": "a", "turn": 1, "usage": {"input_tokens": 10}}\n', ":1: usage.input_tokens: without"),
        (
            '{"call_id": "a", "turn": 1, "usage": {"prompt_tokens": 10}}\n'
            '{"call_id": "a", "turn": 1, "usage": {"prompt_tokens": 12}}\n',
            ":2: turn: call 'a' turn 1 is already recorded at line 1",
        ),
        ("", ": no records"),
    ],
)
def test_bad_input_exits_non_zero_naming_file_line_and_field(
    tmp_path: Path, content: str, where: str
) -> None:
    path = tmp_path / "calls.jsonl"
    path.write_text(content)
    result = CliRunner().invoke(main, ["hitrate", "--calls", str(path)])
    assert result.exit_code == Exit.USAGE, "the file named on the command line is not records"
    assert f"Error: {path}{where}" in result.output


def test_bad_csv_cell_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "calls.csv"
    path.write_text("call_id,turn,prompt_tokens,cached_tokens\na,1,7200,1024\nb,1,7200,lots\n")
    result = CliRunner().invoke(main, ["hitrate", "--calls", str(path)])
    assert result.exit_code == Exit.USAGE
    assert f"Error: {path}:3: cached_tokens: must be a non-negative integer" in result.output


def test_depth_comes_from_warmers_own_stable_prefix_for_a_configured_agent(tmp_path: Path) -> None:
    """An agent the config knows gets warmer's stable share as its depth (what `warmer lint` prints)."""
    config = ROOT / "config" / "example.toml"
    spec = load_config(config).agents["outbound-sales-early"]
    assert isinstance(spec, AgentSpec)
    profile = load_config(config).profiles[spec.model]
    stable = compute_stable_prefix(spec, offline_renderer(profile), offline_tokenizer(profile))
    prompt = stable.turn1_prompt_tokens
    lines = [
        {
            "call_id": f"c{i}",
            "turn": 1,
            "agent": spec.id,
            "usage": {"prompt_tokens": prompt, "cached_tokens": 22 if i % 2 else 0},
        }
        for i in range(10)
    ]
    path = tmp_path / "calls.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = run("--config", str(config), "hitrate", "--calls", str(path), "--json")
    assert result.exit_code == 0, result.output
    (agent,) = json.loads(result.output)["agents"]
    assert agent["depth_source"] == "config"
    assert agent["depth"] == pytest.approx(stable.stable_share)
    assert agent["depth_from_log"] == pytest.approx(22 / prompt)
    assert agent["problem"] == "depth+coverage"


def test_fail_below_judges_the_turn1_hit_rate() -> None:
    result = CliRunner().invoke(
        main, ["hitrate", "--calls", str(EXAMPLE_LOG), "--threshold", "0.5", "--fail-below"]
    )
    assert result.exit_code == Exit.FAILED


def test_chart_writes_a_png(tmp_path: Path) -> None:
    chart = tmp_path / "turn1.png"
    result = run("hitrate", "--calls", str(EXAMPLE_LOG), "--chart", str(chart))
    assert result.exit_code == 0, result.output
    with chart.open("rb") as png:
        header = png.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")
    assert (width, height) == (1100, 420)  # figsize 11 x 4.2 inches at 100 dpi


def test_chart_without_matplotlib_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it now raises ImportError
    result = CliRunner().invoke(
        main, ["hitrate", "--calls", str(EXAMPLE_LOG), "--chart", str(tmp_path / "c.png")]
    )
    assert result.exit_code == Exit.UNAVAILABLE
    assert "--chart needs matplotlib, the `charts` extra: pip install 'warmer[charts]'" in result.output
    assert not (tmp_path / "c.png").exists()


def test_chart_needs_calls(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["hitrate", "--metrics-url", "http://x/metrics", "--chart", str(tmp_path / "c.png")]
    )
    assert result.exit_code == 2
    assert "--chart goes with --calls" in result.output


def test_the_readme_example_is_what_the_command_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    """The README shows `warmer hitrate --calls examples/call-usage.jsonl` on the shipped log, as run."""
    monkeypatch.chdir(ROOT)
    readme = (ROOT / "README.md").read_text()
    command = "$ warmer hitrate --calls examples/call-usage.jsonl\n"
    start = readme.index(command) + len(command)
    shown = readme[start : readme.index("```", start)]
    result = run("hitrate", "--calls", "examples/call-usage.jsonl")
    assert result.output == shown


def test_a_spreadsheet_csv_with_a_byte_order_mark_reads(tmp_path: Path) -> None:
    path = tmp_path / "export.csv"
    path.write_bytes("\ufeffcall_id,turn,prompt_tokens,cached_tokens\na,1,7200,1024\n".encode())
    data = report_of(path)
    assert (data["calls"], data["turn1"]["cached_tokens"]) == (1, 1024)
