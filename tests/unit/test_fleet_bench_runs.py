"""The fleet bench's newer pieces without engines: the crowded shape, the prefix-hash arm's box choice,
the tuned router's flags, the policy rotation, the per-run summaries and their median/range, and the
pre-traffic and later-turn figures."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.fleet import Agents, build_agents, parse_args
from bench.fleet_figures import (
    CallRecord,
    Scrape,
    TurnRecord,
    markdown_table,
    policy_figures,
    pre_traffic_prefill,
)
from bench.fleet_plan import SHAPES, THEMES, CallPlan
from bench.fleet_policies import (
    ROUTER_ARMS,
    PrefixHashPolicy,
    hash_key,
    rendezvous_order,
    warm_up_order,
)
from bench.fleet_runs import aggregate, load_summaries, rotated, summary_table, write_summary

BOXES = ["llama-0", "llama-1", "llama-2"]


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Agents:
    return build_agents(tmp_path_factory.mktemp("crowded"), 3000, 7, SHAPES["crowded"])


# -- shape and arguments --------------------------------------------------------------------------------


def test_shapes_name_6_and_12_agents_and_every_theme_is_distinct() -> None:
    assert SHAPES == {"default": 6, "crowded": 12, "realmix": 12}
    assert len(THEMES) >= SHAPES["crowded"]
    assert len({t.agent_id for t in THEMES}) == len(THEMES)
    assert len({t.company for t in THEMES}) == len(THEMES)
    assert len({t.agent_id[:2] for t in THEMES}) == len(THEMES)  # reference codes stay per agent


def test_parse_args_takes_the_agent_count_from_the_shape_and_names_an_override() -> None:
    assert parse_args(["--shape", "crowded"]).agents == 12
    default = parse_args([])
    assert (default.agents, default.shape, default.runs) == (6, "default", 1)
    odd = parse_args(["--shape", "crowded", "--agents", "4"])
    assert (odd.agents, odd.shape) == (4, "4-agents")
    assert "cache_aware_tuned" in parse_args([]).policy_list
    assert "prefix_hash_prewarm" in parse_args([]).policy_list
    with pytest.raises(SystemExit):
        parse_args(["--runs", "0"])
    with pytest.raises(SystemExit):
        parse_args(["--agents", str(len(THEMES) + 1)])


def test_the_tuned_router_balances_on_a_two_request_gap_and_the_default_ones_take_no_flags() -> None:
    policy, flags = ROUTER_ARMS["cache_aware_tuned"]
    assert policy == "cache_aware"
    assert dict(zip(flags[::2], flags[1::2], strict=True)) == {
        "--balance-abs-threshold": "1",
        "--balance-rel-threshold": "1.0",
    }
    assert ROUTER_ARMS["cache_aware"] == ("cache_aware", ())
    assert ROUTER_ARMS["round_robin"] == ("round_robin", ())


# -- prefix-hash routing --------------------------------------------------------------------------------


def test_rendezvous_order_is_stable_and_a_lost_box_moves_only_its_own_keys() -> None:
    keys = [f"agent-{i}" for i in range(60)]
    first = {k: rendezvous_order(k, BOXES)[0] for k in keys}
    assert first == {k: rendezvous_order(k, list(reversed(BOXES)))[0] for k in keys}  # order-free
    without = {k: rendezvous_order(k, ["llama-0", "llama-1"])[0] for k in keys}
    moved = {k for k in keys if first[k] != without[k]}
    assert moved == {k for k in keys if first[k] == "llama-2"}
    assert moved  # the test would pass vacuously if no key had been on llama-2


def test_prefix_hash_box_choice_is_per_agent_and_spreads_the_crowded_agents(crowded: Agents) -> None:
    choice = {a: rendezvous_order(hash_key(crowded.stable[a].text), BOXES)[0] for a in crowded.order}
    again = {a: rendezvous_order(hash_key(crowded.stable[a].text), BOXES)[0] for a in crowded.order}
    assert choice == again
    per_box = Counter(choice.values())
    assert set(per_box) == set(BOXES)  # every box serves some agent
    assert max(per_box.values()) < len(crowded.order)
    # the key is the agent's static start only: a call's prompt hashes like its agent's stable prefix
    for agent, stable in crowded.stable.items():
        assert len(stable.text) > 256
        assert hash_key(stable.text + "Call details ...") == hash_key(stable.text), agent


def _sse(prompt_tokens: int) -> str:
    chunk = {"choices": [{"text": "x"}]}
    final = {
        "choices": [{"text": ""}],
        "usage": {"prompt_tokens": prompt_tokens, "prompt_tokens_details": {"cached_tokens": 0}},
        "timings": {"prompt_n": prompt_tokens, "cache_n": 0},
    }
    return f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(final)}\n\ndata: [DONE]\n\n"


def test_prefix_hash_policy_warms_the_hashed_box_then_fails_over_in_hash_order() -> None:
    prefixes = {"a": "A" * 300, "b": "B" * 300}
    urls = {box: f"http://{box}:1" for box in BOXES}
    down: set[str] = set()
    seen: list[tuple[str, str, int]] = []
    first: list[tuple[str, str, int]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        body = json.loads(request.content)
        seen.append((host, body["prompt"][:1], body["max_tokens"]))
        if host in down:
            return httpx.Response(503, text="loading")
        return httpx.Response(200, text=_sse(10))

    async def scenario() -> tuple[list[Any], dict[str, Any]]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
            policy = PrefixHashPolicy(client, list(urls.items()), prefixes)
            call = CallPlan(0, "c0", "a", 0.0, {})
            record = CallRecord("c0", "a", 0.0, 300)
            home = policy.order("a")
            healthy = await policy.start_call(call, record, lambda: 0.0)
            first.append(seen[0])
            down.add(home[0])
            failed_over = await policy.start_call(call, record, lambda: 0.0)
            retarget = await policy.retarget(call, record, lambda: 0.0, failed_over)
            down.clear()
            seen.clear()
            done = await policy.warm_up(["a", "b"], prefixes)
            # a stream left at [DONE] hands httpx's inner generators to the loop's finalizer, which
            # closes them on its next turns: give it those before the loop ends
            await asyncio.sleep(0.05)
            return [home, healthy, failed_over, retarget, record.failures], done

    (home, healthy, failed_over, retarget, failures), done = asyncio.run(scenario())
    healthy_first = first[0]
    assert healthy.box_id == home[0]
    assert healthy.base_url == urls[home[0]]
    assert healthy_first == (home[0], "A", 1)  # the stable prefix, max_tokens 1, to the hashed box
    assert failed_over.box_id == home[1]  # the hashed box down: the next in hash order
    assert failures == 1
    assert retarget.box_id != failed_over.box_id
    assert done["warm_requests"] == 2
    assert [p for _, p, _ in seen] == ["B", "A"]  # the warm-up: one per agent, the hottest ("a") last
    assert warm_up_order(["hot", "mid", "cold"]) == ["cold", "mid", "hot"]  # hottest warmed last


# -- rotation and summaries -----------------------------------------------------------------------------


def test_rotation_starts_run_k_at_policy_k_mod_n() -> None:
    policies = ["a", "b", "c"]
    assert rotated(policies, 0) == ["a", "b", "c"]
    assert rotated(policies, 1) == ["b", "c", "a"]
    assert rotated(policies, 2) == ["c", "a", "b"]
    assert rotated(policies, 4) == ["b", "c", "a"]
    assert [rotated(policies, k)[0] for k in range(3)] == policies  # every arm goes first once
    assert rotated([], 3) == []


def _summary(setting: str, figures: dict[str, dict[str, Any]], shape: str = "crowded") -> dict[str, Any]:
    return {
        "kind": "fleet-summary",
        "version": 1,
        "meta": {"shape": shape, "model": "light"},
        "run": {"setting": setting, "git": {"commit": "abcdef123"}, "machine": {"load_at_start": [1.5]}},
        "calibration": {},
        "figures": [{"policy": p, **values} for p, values in figures.items()],
    }


def test_aggregate_gives_median_and_range_per_figure_per_policy() -> None:
    runs = [
        _summary(
            "tight",
            {
                "warmer": {"hit90": 0.9, "ttft_p50_s": 0.1, "calls_served": 110},
                "rr": {"hit90": 0.4, "extra": {"pre_traffic": {"warm_seconds": 2.5}}},
            },
        ),
        _summary("tight", {"warmer": {"hit90": 1.0, "ttft_p50_s": 0.3}, "rr": {"hit90": None}}),
        _summary("tight", {"warmer": {"hit90": 0.95, "ttft_p50_s": 0.2}, "rr": {"hit90": 0.5}}),
    ]
    table = aggregate(runs)
    assert list(table) == ["warmer", "rr"]
    assert table["warmer"]["hit90"] == pytest.approx((0.95, 0.9, 1.0))
    assert table["warmer"]["ttft_p50_s"] == pytest.approx((0.2, 0.1, 0.3))
    assert table["rr"]["hit90"] == pytest.approx((0.45, 0.4, 0.5))  # the run without it is left out
    assert table["rr"]["ttft_p50_s"] is None
    text = summary_table(runs)
    assert "over 3 run(s)" in text
    assert "| turn-1 hit90 share (whole run) | 0.95 (0.90–1.00) | 0.45 (0.40–0.50) |" in text
    assert "| turn-1 TTFT p50 | 200 ms (100 ms–300 ms) | – |" in text
    assert "| calls served | 110 | – |" in text
    assert "| pre-traffic warm time (s) | – | 2.5 |" in text


def test_aggregate_refuses_summaries_of_different_settings_or_shapes() -> None:
    with pytest.raises(ValueError, match="different"):
        aggregate([_summary("tight", {}), _summary("roomy", {})])
    with pytest.raises(ValueError, match="different"):
        aggregate([_summary("tight", {}), _summary("tight", {}, shape="default")])
    with pytest.raises(ValueError, match="no summaries"):
        aggregate([])


def test_summaries_are_small_named_by_shape_and_setting_and_read_back(tmp_path: Path) -> None:
    calls = [
        CallRecord(f"c{i}", "a", float(i), 100, [TurnRecord(1, i, i + 1, 0.1, 100, 95, 5, "b0")])
        for i in range(110)
    ]
    figures = policy_figures("warmer", "tight", calls, [Scrape(0, "b0", 0, 0, 0)], None, 0.05)
    summary = _summary("tight", {})
    summary["figures"] = [figures.as_json()] * 7
    first = write_summary(tmp_path, summary)
    second = write_summary(tmp_path, summary)
    assert first != second  # one second, two runs: both kept
    assert first.name.startswith("fleet-summary-crowded-tight-")
    assert first.stat().st_size < 50_000
    assert len(load_summaries([first, second])) == 2
    (tmp_path / "other.json").write_text('{"kind": "fleet"}')
    with pytest.raises(ValueError, match="not a fleet summary"):
        load_summaries([tmp_path / "other.json"])


# -- pre-traffic and later turns ------------------------------------------------------------------------


def test_pre_traffic_prefill_is_each_box_at_traffic_start_minus_before() -> None:
    before = {"b0": 0.0, "b1": 100.0, "b2": 50.0}
    at_start = {"b0": 3000.0, "b1": 2100.0}  # b2 did not answer at traffic start
    assert pre_traffic_prefill(before, at_start) == 3000.0 + 2000.0
    assert pre_traffic_prefill({"b0": 10.0}, {"b0": 5.0}) == 0.0  # never negative


def test_all_prefill_adds_the_pre_traffic_warm_and_keeps_the_traffic_only_figure() -> None:
    calls = [CallRecord("c", "a", 0.0, 100, [TurnRecord(1, 0.0, 1.0, 0.1, 100, 0, 100, "b0")])]
    scrapes = [Scrape(0.0, "b0", 0, 500.0, 0.0), Scrape(5.0, "b0", 0, 800.0, 0.0)]
    with_warm = policy_figures("warmer", "tight", calls, scrapes, None, None, pre_traffic_tokens=500.0)
    assert with_warm.engine_prefill_tokens == 300.0  # from traffic start, as before
    assert with_warm.pre_traffic_prefill_tokens == 500.0
    assert with_warm.engine_prefill_with_pre_traffic == 800.0
    without = policy_figures("rr", "tight", calls, scrapes, None, None)
    assert without.engine_prefill_with_pre_traffic is None
    table = markdown_table([with_warm, without])
    assert "| all prefill incl. pre-traffic (uncached tokens, engines) | 800 | – |" in table
    assert "| all prefill from traffic start (uncached tokens, engines) | 300 | 300 |" in table


def test_later_turn_figures_count_turns_two_and_on_only() -> None:
    turns = [
        TurnRecord(1, 0.0, 1.0, 0.1, 1000, 0, 1000, None),  # a cold turn 1: not a later turn
        TurnRecord(2, 2.0, 3.0, 0.1, 1100, 1000, 100, None),  # 0.909: a hit
        TurnRecord(3, 4.0, 5.0, 0.1, 1200, 600, 600, None),  # 0.5: a miss
    ]
    calls = [CallRecord("c", "a", 0.0, 900, turns), CallRecord("d", "a", 1.0, 900, [turns[0]])]
    figures = policy_figures("rr", "tight", calls, [], None, None)
    assert figures.later_turns == 2
    assert figures.later_hit90 == pytest.approx(0.5)
    assert figures.later_cached_mean == pytest.approx((1000 / 1100 + 0.5) / 2)
    assert figures.hit90 == 0.0
    one_turn_only = policy_figures("rr", "tight", calls[1:], [], None, None)
    assert one_turn_only.later_hit90 is None
    assert "| turns ≥ 2 hit90 share | 0.50 |" in markdown_table([figures])
