"""The planner with a fake clock (plain floats): ordering, keepalive timing, coalescing, budget, readiness."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from warmer.core.model import BoxSpec, Campaign, EngineKind, ModelProfile, WarmRecord, WarmState
from warmer.core.plan_actions import (
    AbandonWarm,
    MarkStale,
    ProbePrefix,
    ProbeReason,
    Retire,
    RunRestartWarmup,
    WarmPrefix,
    WarmReason,
)
from warmer.core.planner import (
    BoxObservation,
    Desired,
    Observed,
    PlannerConfig,
    PrefixRef,
    WarmupStatus,
    index_plan,
    keepalive_due_at,
    plan,
    plan_boxes,
)
from warmer.core.readiness import agent_warmth, box_ready, boxes_ready, routes
from warmer.core.warm_budget import TokenBucket, WarmBudget

PLAIN = ModelProfile(name="plain", engine=EngineKind.LLAMACPP, keepalive_seconds=240.0)
HYBRID = ModelProfile(name="hybrid", engine=EngineKind.SGLANG, running_state=True, warm_requests_per_prefix=3)
BIG = WarmBudget(max_concurrent=100, tokens_per_second=1e9, burst_tokens=1e9)


def box(box_id: str, model: str = "plain") -> BoxSpec:
    return BoxSpec(id=box_id, base_url=f"http://{box_id}:8000", engine=EngineKind.LLAMACPP, model=model)


def desired(
    assignment: Mapping[str, tuple[str, ...]],
    *,
    tokens: int = 1000,
    models: Mapping[str, str] | None = None,
    **extra: object,
) -> Desired:
    box_ids = sorted({b for group in assignment.values() for b in group})
    return Desired(
        boxes={b: box(b, (models or {}).get(b, "plain")) for b in box_ids},
        profiles={"plain": PLAIN, "hybrid": HYBRID},
        agents={a: PrefixRef(f"p-{a}", tokens) for a in assignment},
        assignment=assignment,
        last_activity=extra.pop("last_activity", dict.fromkeys(assignment, 0.0)),  # type: ignore[arg-type]
        **extra,  # type: ignore[arg-type]
    )


def up(epoch: str = "e1", warmup: WarmupStatus = WarmupStatus.DONE, finished: float = 0.0) -> BoxObservation:
    return BoxObservation(healthy=True, epoch=epoch, warmup=warmup, warmup_finished_at=finished)


def warm(
    box_id: str,
    agent: str,
    verified_at: float,
    *,
    epoch: str = "e1",
    state: WarmState = WarmState.WARM,
    warmed_at: float | None = None,
    tokens: int = 1000,
) -> WarmRecord:
    return WarmRecord(
        box_id=box_id,
        epoch=epoch,
        prefix_hash=f"p-{agent}",
        state=state,
        prefix_tokens=tokens,
        updated_at=verified_at,
        verified_at=verified_at,
        warmed_at=verified_at if warmed_at is None else warmed_at,
    )


def records(*rs: WarmRecord) -> dict[tuple[str, str, str], WarmRecord]:
    return {(r.box_id, r.epoch, r.prefix_hash): r for r in rs}


def config(**kw: object) -> PlannerConfig:
    base: dict[str, object] = {"budget": BIG, "retire_idle_after_seconds": None}
    base.update(kw)
    return PlannerConfig(**base)  # type: ignore[arg-type]


def warms(actions: tuple[object, ...]) -> list[WarmPrefix]:
    return [a for a in actions if isinstance(a, WarmPrefix)]


def test_restart_warmup_precedes_prefixes() -> None:
    want = desired({"a": ("b1",)})
    fresh = plan(want, Observed(boxes={"b1": up(warmup=WarmupStatus.NOT_STARTED)}), 10.0, config())
    assert fresh.actions == (RunRestartWarmup("b1", "e1"),)
    running = plan(want, Observed(boxes={"b1": up(warmup=WarmupStatus.RUNNING)}), 11.0, config())
    assert running.actions == ()
    done = plan(want, Observed(boxes={"b1": up()}), 12.0, config())
    assert done.actions == (WarmPrefix("b1", "e1", "p-a", 1000, 1, WarmReason.ASSIGNED, ("a",)),)


def test_failed_restart_warmup_is_retried_after_a_pause() -> None:
    want = desired({"a": ("b1",)})
    failed = Observed(boxes={"b1": up(warmup=WarmupStatus.FAILED, finished=100.0)})
    assert plan(want, failed, 129.9, config(restart_warmup_retry_seconds=30.0)).actions == ()
    assert plan(want, failed, 130.0, config(restart_warmup_retry_seconds=30.0)).actions == (
        RunRestartWarmup("b1", "e1"),
    )


def test_unhealthy_or_unknown_boxes_get_nothing() -> None:
    want = desired({"a": ("b1", "b2", "b3")})
    seen = Observed(
        boxes={
            "b1": BoxObservation(healthy=False, epoch="e1", warmup=WarmupStatus.DONE),
            "b2": BoxObservation(healthy=True, epoch=None),
        }
    )
    assert plan(want, seen, 1.0, config()).actions == ()


def test_running_state_models_get_n_requests() -> None:
    want = desired({"a": ("b1",)}, models={"b1": "hybrid"})
    result = plan(want, Observed(boxes={"b1": up()}), 1.0, config())
    assert [w.requests for w in warms(result.actions)] == [3]


def test_keepalive_due_exactly_when_expected_and_never_earlier() -> None:
    cfg = config(keepalive_jitter=0.1)
    want = desired({"a": ("b1",)})
    record = warm("b1", "a", verified_at=1000.0)
    due = keepalive_due_at(record, PLAIN, cfg)
    assert due is not None
    assert 1000.0 + 240.0 * 0.9 <= due <= 1000.0 + 240.0  # jittered just under the horizon
    assert keepalive_due_at(record, PLAIN, cfg) == due  # deterministic per (box, prefix)
    seen = Observed(boxes={"b1": up()}, warm=records(record))
    assert plan(want, seen, due - 0.001, cfg).actions == ()
    at_due = plan(want, seen, due, cfg).actions
    assert at_due == (
        MarkStale("b1", "e1", "p-a"),
        WarmPrefix("b1", "e1", "p-a", 1000, 1, WarmReason.KEEPALIVE, ("a",)),
    )


def test_keepalive_jitter_differs_between_prefixes_and_respects_overrides() -> None:
    cfg = config(keepalive_jitter=0.2, keepalive_overrides={"b2": 60.0})
    dues = {keepalive_due_at(warm("b1", f"a{i}", 0.0), PLAIN, cfg) for i in range(20)}
    assert len(dues) == 20
    assert all(d is not None and 192.0 <= d <= 240.0 for d in dues)
    override = keepalive_due_at(warm("b2", "a", 0.0), PLAIN, cfg)
    assert override is not None
    assert 48.0 <= override <= 60.0


def test_a_measured_eviction_horizon_brings_the_touch_just_inside_it() -> None:
    """Engines evict least recently used first (vLLM `FreeKVCacheBlockQueue`): a prefix left untouched longer
    than other blocks last is gone, so the touch comes inside the measured horizon, not at the profile's
    240 s; never shorter than the floor, never later than the profile."""
    cfg = config(keepalive_jitter=0.1, horizon_margin=0.2, keepalive_floor_seconds=5.0)
    want = desired({"a": ("b1",)})
    record = warm("b1", "a", verified_at=1000.0)
    due = keepalive_due_at(record, PLAIN, cfg, horizon=50.0)
    assert due is not None
    assert 1000.0 + 40.0 * 0.9 <= due <= 1000.0 + 40.0  # 50 s horizon, touched 20% inside it
    seen = Observed(boxes={"b1": up()}, warm=records(record), keepalive_horizons={"b1": 50.0})
    assert plan(want, seen, due - 0.001, cfg).actions == ()
    touched = warms(plan(want, seen, due, cfg).actions)
    assert [(w.prefix_hash, w.reason) for w in touched] == [("p-a", WarmReason.KEEPALIVE)]
    unmeasured = Observed(boxes={"b1": up()}, warm=records(record))
    assert plan(want, unmeasured, due, cfg).actions == ()  # without events: the profile's 240 s
    floor = keepalive_due_at(record, PLAIN, replace(cfg, keepalive_jitter=0.0), horizon=1.0)
    assert floor == 1005.0
    late = keepalive_due_at(record, PLAIN, replace(cfg, keepalive_jitter=0.0), horizon=10_000.0)
    assert late == 1240.0


def test_stale_is_touched_without_marking_again() -> None:
    want = desired({"a": ("b1",)})
    stale = warm("b1", "a", verified_at=0.0, state=WarmState.STALE)
    actions = plan(want, Observed(boxes={"b1": up()}, warm=records(stale)), 250.0, config()).actions
    assert actions == (WarmPrefix("b1", "e1", "p-a", 1000, 1, WarmReason.KEEPALIVE, ("a",)),)


def test_coalescing_one_warm_per_box_prefix() -> None:
    # two agents share one prefix: one warm, both agents named
    assignment = {"a": ("b1",), "b": ("b1",)}
    want = Desired(
        boxes={"b1": box("b1")},
        profiles={"plain": PLAIN},
        agents={"a": PrefixRef("shared", 500), "b": PrefixRef("shared", 500)},
        assignment=assignment,
        last_activity={"a": 0.0, "b": 0.0},
    )
    result = plan(want, Observed(boxes={"b1": up()}), 1.0, config())
    assert result.actions == (WarmPrefix("b1", "e1", "shared", 500, 1, WarmReason.ASSIGNED, ("a", "b")),)
    # already in flight: nothing more, even though the row still says cold
    busy = Observed(boxes={"b1": up()}, in_flight=frozenset({("b1", "shared")}))
    assert plan(want, busy, 2.0, config()).actions == ()


def test_warming_row_with_nothing_in_flight_is_abandoned_after_timeout() -> None:
    want = desired({"a": ("b1",)})
    row = WarmRecord("b1", "e1", "p-a", WarmState.WARMING, 1000, updated_at=100.0)
    seen = Observed(boxes={"b1": up()}, warm=records(row))
    assert plan(want, seen, 399.0, config(warming_timeout_seconds=300.0)).actions == ()
    assert plan(want, seen, 400.0, config(warming_timeout_seconds=300.0)).actions == (
        AbandonWarm("b1", "e1", "p-a", "warm in flight was lost"),
    )
    in_flight = Observed(boxes={"b1": up()}, warm=records(row), in_flight=frozenset({("b1", "p-a")}))
    assert plan(want, in_flight, 400.0, config(warming_timeout_seconds=300.0)).actions == ()


def test_warming_row_left_by_an_earlier_daemon_is_abandoned_at_once() -> None:
    want = desired({"a": ("b1",)})
    row = WarmRecord("b1", "e1", "p-a", WarmState.WARMING, 1000, updated_at=100.0)
    restarted = Observed(boxes={"b1": up()}, warm=records(row), trusted_after=100.5)
    assert plan(want, restarted, 101.0, config(warming_timeout_seconds=300.0)).actions == (
        AbandonWarm("b1", "e1", "p-a", "left warming by an earlier daemon"),
    )
    # this daemon's own warm (written after it started) still gets the timeout, and one in flight is kept
    own = Observed(boxes={"b1": up()}, warm=records(row), trusted_after=100.0)
    assert plan(want, own, 101.0, config(warming_timeout_seconds=300.0)).actions == ()
    sending = Observed(
        boxes={"b1": up()}, warm=records(row), trusted_after=100.5, in_flight=frozenset({("b1", "p-a")})
    )
    assert plan(want, sending, 101.0, config(warming_timeout_seconds=300.0)).actions == ()


def test_concurrency_budget_counts_in_flight() -> None:
    want = desired({f"a{i}": ("b1",) for i in range(6)})
    cfg = config(budget=WarmBudget(max_concurrent=2, tokens_per_second=1e9, burst_tokens=1e9))
    assert len(warms(plan(want, Observed(boxes={"b1": up()}), 1.0, cfg).actions)) == 2
    one_busy = Observed(boxes={"b1": up()}, in_flight=frozenset({("b1", "p-a0")}))
    assert [w.prefix_hash for w in warms(plan(want, one_busy, 1.0, cfg).actions)] == ["p-a1"]


def test_token_budget_is_never_exceeded_over_time() -> None:
    budget = WarmBudget(max_concurrent=50, tokens_per_second=100.0, burst_tokens=3000.0)
    cfg = config(budget=budget)
    want = desired({f"a{i}": ("b1",) for i in range(40)}, tokens=1000)
    bucket: dict[str, TokenBucket] = {}
    done: dict[tuple[str, str, str], WarmRecord] = {}
    spent = 0
    now = 0.0
    first_step = 0
    while now <= 300.0:
        result = plan(want, Observed(boxes={"b1": up()}, warm=done, buckets=bucket), now, cfg)
        bucket = dict(result.buckets)
        for action in warms(result.actions):
            spent += action.prefix_tokens * action.requests
            done[("b1", "e1", action.prefix_hash)] = warm("b1", action.prefix_hash[2:], now)
        if now == 0.0:
            first_step = spent
        assert spent <= budget.burst_tokens + budget.tokens_per_second * now
        now += 0.5
    assert first_step == 3000  # a full bucket allows a burst, no more
    assert spent >= 0.9 * (budget.burst_tokens + budget.tokens_per_second * 300.0)  # and the rate is used


def test_a_prefix_bigger_than_the_bucket_still_gets_warmed_from_a_full_bucket() -> None:
    cfg = config(budget=WarmBudget(max_concurrent=2, tokens_per_second=10.0, burst_tokens=500.0))
    result = plan(desired({"a": ("b1",), "b": ("b1",)}, tokens=2000), Observed(boxes={"b1": up()}), 0.0, cfg)
    assert len(warms(result.actions)) == 1
    assert result.buckets["b1"].tokens == -1500.0  # debt: nothing else until refilled


def test_priority_precall_then_campaign_then_assigned_then_keepalive() -> None:
    assignment = {"plain": ("b1",), "camp": ("b1",), "call": ("b1",), "old": ("b1",)}
    want = desired(
        assignment,
        campaigns=(Campaign("c1", "camp", starts_at=1000.0, ends_at=2000.0),),
        precall=frozenset({"call"}),
    )
    stale = warm("b1", "old", 0.0, state=WarmState.STALE)
    seen = Observed(boxes={"b1": up()}, warm=records(stale))
    cfg = config(campaign_lead_seconds=300.0)
    reasons = [(w.prefix_hash, w.reason) for w in warms(plan(want, seen, 700.0, cfg).actions)]
    assert reasons == [
        ("p-call", WarmReason.PRECALL),
        ("p-camp", WarmReason.CAMPAIGN),
        ("p-plain", WarmReason.ASSIGNED),
        ("p-old", WarmReason.KEEPALIVE),
    ]
    tight = config(campaign_lead_seconds=300.0, budget=WarmBudget(max_concurrent=2))
    assert [w.prefix_hash for w in warms(plan(want, seen, 700.0, tight).actions)] == ["p-call", "p-camp"]


def test_idle_agents_are_retired_and_campaigns_keep_them() -> None:
    cfg = config(retire_idle_after_seconds=600.0, campaign_lead_seconds=100.0)
    campaign = Campaign("c", "a", starts_at=5000.0, ends_at=6000.0)
    want = desired({"a": ("b1",)}, last_activity={"a": 0.0}, campaigns=(campaign,))
    seen = Observed(boxes={"b1": up()}, warm=records(warm("b1", "a", 500.0)))
    assert plan(want, seen, 600.0, cfg).actions == ()  # still active, keepalive not due
    assert plan(want, seen, 601.0, cfg).actions == (
        Retire("b1", "e1", "p-a", "not kept warm here: idle or moved"),
    )
    # from lead time before the campaign until its end, it is warm again
    cold = Observed(boxes={"b1": up()})
    assert warms(plan(want, cold, 4899.0, cfg).actions) == []
    assert [w.reason for w in warms(plan(want, cold, 4900.0, cfg).actions)] == [WarmReason.CAMPAIGN]
    assert warms(plan(want, cold, 6000.0, cfg).actions) == []


def test_failed_prefix_waits_for_its_backoff() -> None:
    want = desired({"a": ("b1",)})
    failed = WarmRecord("b1", "e1", "p-a", WarmState.FAILED, 1000, attempts=1, updated_at=100.0)
    seen = Observed(boxes={"b1": up()}, warm=records(failed))
    assert plan(want, seen, 104.9, config()).actions == ()
    assert len(warms(plan(want, seen, 105.0, config()).actions)) == 1


def test_new_epoch_ignores_old_rows_and_starts_over() -> None:
    want = desired({"a": ("b1",)})
    old = warm("b1", "a", 0.0, epoch="e1")
    restarted = Observed(boxes={"b1": up(epoch="e2", warmup=WarmupStatus.NOT_STARTED)}, warm=records(old))
    assert plan(want, restarted, 10.0, config()).actions == (RunRestartWarmup("b1", "e2"),)
    after = Observed(boxes={"b1": up(epoch="e2", finished=20.0)}, warm=records(old))
    assert [(w.epoch, w.reason) for w in warms(plan(want, after, 21.0, config()).actions)] == [
        ("e2", WarmReason.ASSIGNED)
    ]
    assert routes(want, after, 21.0, config())["a"] == ()
    assert not box_ready("b1", want, after, 21.0, config()).ready


def test_untrusted_and_suspect_rows_are_probed() -> None:
    want = desired({"a": ("b1",), "b": ("b2",)})
    rows = records(warm("b1", "a", 100.0), warm("b2", "b", 100.0))
    restarted = Observed(boxes={"b1": up(), "b2": up()}, warm=rows, trusted_after=150.0)
    probes = [a for a in plan(want, restarted, 160.0, config()).actions if isinstance(a, ProbePrefix)]
    assert [(p.box_id, p.reason) for p in probes] == [
        ("b1", ProbeReason.UNTRUSTED),
        ("b2", ProbeReason.UNTRUSTED),
    ]
    suspect = Observed(boxes={"b1": up(), "b2": up()}, warm=rows, suspect_boxes=frozenset({"b2"}))
    cfg = config(probe_min_interval_seconds=60.0)
    assert plan(want, suspect, 159.0, cfg).actions == ()
    probes = [a for a in plan(want, suspect, 160.0, cfg).actions if isinstance(a, ProbePrefix)]
    assert [(p.box_id, p.reason) for p in probes] == [("b2", ProbeReason.SUSPECT)]


def test_box_ready_needs_warmup_and_every_assigned_prefix() -> None:
    want = desired({"a": ("b1",), "b": ("b1",)})
    cfg = config()
    not_warmed = Observed(boxes={"b1": up(warmup=WarmupStatus.RUNNING)})
    assert box_ready("b1", want, not_warmed, 5.0, cfg).reasons == ("restart warm-up running",)
    half = Observed(boxes={"b1": up(finished=10.0)}, warm=records(warm("b1", "a", 20.0)))
    readiness = box_ready("b1", want, half, 30.0, cfg)
    assert not readiness.ready
    assert readiness.reasons == ("agent b: prefix p-b cold",)
    full = Observed(
        boxes={"b1": up(finished=10.0)}, warm=records(warm("b1", "a", 20.0), warm("b1", "b", 25.0))
    )
    readiness = box_ready("b1", want, full, 30.0, cfg)
    assert readiness.ready
    assert readiness.since == 25.0
    down = Observed(boxes={"b1": BoxObservation(healthy=False, epoch="e1")}, warm=full.warm)
    assert not box_ready("b1", want, down, 31.0, cfg).ready


def test_boxes_ready_answers_each_box_as_box_ready_does() -> None:
    """A pass asks of every box at once; the answers are those of one box at a time, whatever the reason."""
    want = desired(
        {"a": ("b1", "b2"), "b": ("b2", "b3"), "c": ("b4",), "d": ("b5",), "e": ("b6",)},
        routing={"a": ("b1", "b2"), "b": ("b2", "b3"), "c": ("b4",), "d": (), "e": ("b6",)},
        placed=frozenset({"b1", "b2", "b3", "b4", "b5"}),
    )
    seen = Observed(
        boxes={
            "b1": up(finished=5.0),
            "b2": up(finished=5.0),
            "b3": up(warmup=WarmupStatus.RUNNING),
            "b4": replace(up(finished=5.0), draining=True),  # drained, still routed: judged by its prefixes
            "b5": replace(up(finished=5.0), draining=True),  # drained and routed nowhere
            "b6": up(finished=5.0),  # not placed on yet
            "b7": BoxObservation(healthy=False, epoch="e1"),
        },
        warm=records(warm("b1", "a", 20.0), warm("b2", "a", 20.0), warm("b4", "c", 30.0)),
    )
    box_ids = ["b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8"]
    together = boxes_ready(box_ids, want, seen, 40.0, config())
    assert together == {b: box_ready(b, want, seen, 40.0, config()) for b in box_ids}
    assert {b for b, answer in together.items() if answer.ready} == {"b1", "b4"}
    assert together["b2"].reasons == ("agent b: prefix p-b cold",)
    assert together["b5"].reasons == ("drained for a rollout",)
    assert together["b6"].reasons == ("waiting for placement",)


def test_routes_only_where_that_agents_prefix_is_warm_with_ramp() -> None:
    want = desired({"a": ("b1", "b2"), "b": ("b2",)})
    cfg = config(ramp_seconds=100.0, ramp_initial_weight=0.1)
    rows = records(warm("b1", "a", 50.0), warm("b2", "b", 50.0))
    seen = Observed(boxes={"b1": up(finished=0.0), "b2": up(finished=0.0)}, warm=rows)
    at_start = routes(want, seen, 50.0, cfg)
    assert [(r.box_id, r.weight) for r in at_start["a"]] == [("b1", 0.1)]  # b2 is not warm for a
    assert [(r.box_id, r.weight) for r in at_start["b"]] == [("b2", 0.1)]
    midway = routes(want, seen, 100.0, cfg)["a"][0].weight
    assert midway == pytest.approx(0.55)
    assert routes(want, seen, 150.0, cfg)["a"][0].weight == 1.0
    # losing readiness drops out at once: restart (new epoch), eviction, health
    restarted = Observed(boxes={"b1": up(epoch="e2", warmup=WarmupStatus.RUNNING), "b2": up()}, warm=rows)
    assert routes(want, restarted, 151.0, cfg)["a"] == ()
    evicted = records(warm("b1", "a", 50.0, state=WarmState.EVICTED), warm("b2", "b", 50.0))
    assert routes(want, Observed(boxes=seen.boxes, warm=evicted), 151.0, cfg)["a"] == ()


def test_routes_for_some_agents_are_those_agents_entries_of_the_full_answer() -> None:
    want = desired({"a": ("b1", "b2"), "b": ("b2",), "c": ("b1",)})
    rows = records(warm("b1", "a", 50.0), warm("b2", "a", 60.0), warm("b2", "b", 50.0))
    seen = Observed(boxes={"b1": up(finished=0.0), "b2": up(finished=0.0)}, warm=rows)
    cfg = config(ramp_seconds=100.0)
    full = routes(want, seen, 80.0, cfg)
    assert routes(want, seen, 80.0, cfg, only=("a",)) == {"a": full["a"]}
    assert routes(want, seen, 80.0, cfg, only=("b", "c")) == {"b": full["b"], "c": ()}
    assert routes(want, seen, 80.0, cfg, only=("nobody",)) == {}


def test_routes_follow_routing_not_keep_warm() -> None:
    rows = records(warm("b1", "a", 10.0), warm("b2", "a", 10.0))
    want = desired({"a": ("b1", "b2")}, routing={"a": ("b2",)})
    seen = Observed(boxes={"b1": up(), "b2": up()}, warm=rows)
    assert [r.box_id for r in routes(want, seen, 500.0, config())["a"]] == ["b2"]


def test_plan_is_deterministic() -> None:
    want = desired({f"a{i}": (f"b{i % 3}", f"b{(i + 1) % 3}") for i in range(12)})
    seen = Observed(boxes={f"b{i}": up() for i in range(3)}, warm=records(warm("b0", "a0", 0.0)))
    assert plan(want, seen, 500.0, config()) == plan(want, seen, 500.0, config())


def test_agent_warmth_covers_every_wanted_pair_and_only_the_current_epoch() -> None:
    want = desired({"a": ("b1", "b2"), "b": ("b2",)}, routing={"a": ("b1",), "b": ("b2", "b3")})
    seen = Observed(
        boxes={"b1": up(), "b2": up(epoch="e2"), "b3": BoxObservation(healthy=False, epoch="e1")},
        warm=records(warm("b1", "a", 10.0), warm("b2", "a", 10.0), warm("b2", "b", 10.0, epoch="e2")),
    )
    assert agent_warmth(want, seen) == {
        ("b1", "a"): True,
        ("b2", "a"): False,  # warm only in an older epoch
        ("b2", "b"): True,
        ("b3", "b"): False,  # routed to, but the box is down
    }


def test_one_agents_boxes_are_planned_alone_as_the_full_plan_plans_them() -> None:
    """A pre-call ask for one agent re-plans its boxes from the kept per-box index, with exactly the
    actions a full plan gives those boxes (shared boxes include the other agents' work)."""
    assignment = {"a": ("b1", "b2"), "b": ("b2", "b3"), "c": ("b3",)}
    before = desired(assignment, last_activity={"b": 0.0, "c": 0.0})  # a idle
    seen = Observed(
        boxes={b: up() for b in ("b1", "b2", "b3")},
        warm=records(warm("b2", "b", 0.0), warm("b3", "c", 0.0)),
        in_flight=frozenset({("b3", "p-b")}),
    )
    cfg = config(retire_idle_after_seconds=600.0)
    index = index_plan(before, seen, 100.0, cfg)
    assert plan_boxes(before, seen, 100.0, cfg, ["b2"], index).actions == tuple(
        a for a in plan(before, seen, 100.0, cfg).actions if a.box_id == "b2"
    )
    asked = replace(before, precall=frozenset({"a"}), assignment={**assignment, "a": ("b1", "b3")})
    again = index.refresh_agents(asked, 100.0, cfg, ["a"])
    assert again == {"b1", "b2", "b3"}  # its old boxes and its new ones
    alone = plan_boxes(asked, seen, 100.0, cfg, again, index)
    full = plan(asked, seen, 100.0, cfg)
    assert alone.actions == full.actions
    assert [w.reason for w in warms(alone.actions) if w.prefix_hash == "p-a"] == [WarmReason.PRECALL] * 2
    seen_later = replace(seen, warm={**seen.warm, **records(warm("b1", "a", 100.0))})
    index.set_box("b1", [seen_later.warm[("b1", "e1", "p-a")]], ())
    assert plan_boxes(asked, seen_later, 100.0, cfg, ["b1"], index).actions == tuple(
        a for a in plan(asked, seen_later, 100.0, cfg).actions if a.box_id == "b1"
    )


def test_a_keepalive_is_due_exactly_at_its_jittered_time() -> None:
    """Records far from due skip the jitter hash; at the boundary the plan still follows the exact due."""
    record = warm("b1", "a", 0.0)
    cfg = config(keepalive_jitter=0.5)
    due = keepalive_due_at(record, PLAIN, cfg)
    assert due is not None
    seen = Observed(boxes={"b1": up()}, warm=records(record))
    want = desired({"a": ("b1",)})
    assert plan(want, seen, 120.0 - 1e-9, cfg).actions == ()  # before even the shortest interval
    assert plan(want, seen, due - 1e-6, cfg).actions == ()
    assert MarkStale("b1", "e1", "p-a") in plan(want, seen, due, cfg).actions
