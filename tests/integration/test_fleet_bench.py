"""The fleet benchmark's machinery at a tiny size, on real processes: 2 llama-server boxes (light model),
the real sglang-router (cache_aware) and a real `warmer serve` with the deploy webhook, a handful of calls
and a rolling restart. It guards the mechanism, not a timing: every turn is what the engine reported for
exactly the prompt warmer renders, the engine counters add up across the restart, and warmer's answers
are recorded. Bounded waits only.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bench.fleet import build_agents, model_path, parse_args, run_bench, save, turn_prompt
from bench.fleet_plan import ScheduleSpec, make_schedule
from warmer.config.profiles import load_profile
from warmer.config.tokenizer import offline_tokenizer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_fleet_bench_records_engine_numbers_for_routers_and_warmer(
    llama_server_binary: Path, tmp_path: Path
) -> None:
    args = parse_args(
        [
            "--setting", "tight", "--model", "light", "--policies", "cache_aware,warmer",
            "--shape", "realmix", "--boxes", "2", "--agents", "2", "--calls", "5",
            "--window", "10", "--pause", "0.3,0.8", "--restart-gap", "0.5", "--reply-tokens", "4",
            "--warm-timeout", "120", "--results-dir", str(tmp_path / "results"),
        ]
    )  # fmt: skip
    result = asyncio.run(run_bench(args, llama_server_binary, model_path("light"), tmp_path / "work"))
    saved = json.loads(save(result, args.results_dir).read_text())
    assert "cache_aware" in saved["table"]
    assert "warmer" in saved["table"]

    tight = result.settings["tight"]["repeats"][0]
    assert tight["policy_order"] == ["cache_aware", "warmer"]
    summary = json.loads(Path(tight["summary_path"]).read_text())
    assert [f["policy"] for f in summary["figures"]] == ["cache_aware", "warmer"]
    assert tight["calibration"]["limit_s"] > 0
    # the limit is turn 1 with the stable prefix cached: the engine said so for every sample
    assert tight["calibration"]["warm_min_prefix_cached_ratio"] >= 0.99
    # the same seeded agents and schedule, rebuilt here: what each call's turn 1 was, as warmer renders it
    agents = build_agents(
        tmp_path / "agents", args.prompt_tokens, args.seed, args.agents, args.mix.prompt_tokens
    )
    schedule = ScheduleSpec(
        calls=args.calls,
        arrival_window_s=args.window,
        pause_s=args.pause_range,
        seed=args.seed,
        turn_weights=args.mix.turn_weights,
        tool_share=args.mix.tool_share,
        background=True,
    )
    plans = {c.call_id: c for c in make_schedule(schedule, agents.order)}
    tokenize = offline_tokenizer(load_profile(REPO / "models" / "tiny-demo.toml"))
    stable_tokens = result.meta["stable_prefix_tokens"]
    turn1_tokens = result.meta["turn1_prompt_tokens"]

    for run, figures in zip(tight["runs"], tight["figures"], strict=True):
        policy = run["policy"]
        calls = run["calls"]
        assert len(calls) == 5, policy
        served = [c for c in calls if c["turns"]]
        assert served, f"{policy}: no call was served"
        for record in served:
            first = record["turns"][0]
            assert first["turn"] == 1
            # the engine saw exactly the prompt warmer renders: the offline tokenizer's count of it
            expected = len(tokenize(turn_prompt(agents, plans[record["call_id"]], [])))
            assert first["prompt_tokens"] == expected, (policy, record["call_id"])
            for turn in record["turns"]:
                assert 0 <= turn["cached_tokens"] <= turn["prompt_tokens"]
                assert turn["processed_tokens"] + turn["cached_tokens"] == turn["prompt_tokens"]
            assert record["stable_tokens"] == stable_tokens[record["agent"]]
            # the real mix: one background request once the call reached its second turn (or its only one)
            plan = plans[record["call_id"]]
            if len(record["turns"]) >= (plan.background_after or 0) and not record["error"]:
                (background,) = record["background"]
                assert (
                    background["processed_tokens"] + background["cached_tokens"]
                    == background["prompt_tokens"]
                )
                assert background["prompt_tokens"] > 0
                if policy != "cache_aware":  # behind warmer: the box of the turn it followed (a call moved
                    # by the rolling restart sends it where its turns went then)
                    sent_after = record["turns"][(plan.background_after or 1) - 1]
                    assert background["box_id"] == sent_after["box_id"]
        assert sum(c.turns for c in plans.values()) > 2 * len(plans)  # calls of several turns
        with_background = sum(b["processed_tokens"] for c in calls for b in c["background"])
        assert figures["calls_prefill_tokens"] >= with_background > 0  # counted as the calls' own

        # every box was restarted once, and its counters were read on both sides of the restart
        assert sorted(r["box_id"] for r in run["restarts"]) == ["llama-0", "llama-1"]
        for box in ("llama-0", "llama-1"):
            epochs = {s["epoch"] for s in run["scrapes"] if s["box_id"] == box}
            assert epochs == {0, 1}, (policy, box, epochs)
        assert figures["engine_prefill_tokens"] >= figures["calls_prefill_tokens"] > 0
        # every arm warmed each agent before traffic, and that is counted apart and in the total
        assert figures["pre_traffic_prefill_tokens"] > 0, policy
        assert figures["engine_prefill_with_pre_traffic"] == pytest.approx(
            figures["engine_prefill_tokens"] + figures["pre_traffic_prefill_tokens"]
        )
        if policy == "cache_aware":
            # a router sends nothing but the calls: what the engines prefilled beyond the calls' own
            # turns can only come from attempts that failed (at most one prompt each)
            assert figures["warm_prefill_tokens"] <= figures["failures"] * max(turn1_tokens.values()) + 64
        else:
            assert run["pre_traffic"]["all_agents_routed"] is True
            assert figures["warm_prefill_tokens"] > 0  # warmer warmed the restarted boxes
            assert all(r["webhook_status"] == [202, 202] for r in run["restarts"]), run["restarts"]
            for record in served:
                answer = record["turn1_answer"]
                assert answer is not None
                assert answer["status"] == 200
                assert answer["box_id"] == record["turns"][0]["box_id"] in ("llama-0", "llama-1")
            assert figures["ready_answers"] == sum(1 for c in served if c["turn1_answer"]["ready"])
            assert run["box_timeline"], "warmer's box view was polled"
            assert set(run["warmup_windows"]) == {"llama-0", "llama-1"}
