"""Capacity for pacing: prefill ceilings, uncached use from the engines' own counters, headroom per agent.

The figures are checked against recorded engine output: llama-server `/metrics` texts and a `/completion`
body (shapes in tests/unit/engine_shapes.py), vLLM's prefix-cache counters, and the seed's numbers
(a ~10,000 tokens/s ceiling whose latency broke near 6,000 uncached tokens/s).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from tests.unit.engine_shapes import LLAMACPP_METRICS, SGLANG_METRICS, VLLM_METRICS, llamacpp_completion
from tests.unit.reconciler_fakes import (
    PREFIX_TOKENS,
    PROFILE,
    FakeClock,
    FakeEngine,
    FakePrefixSource,
    agent,
    boxes,
    settle,
)
from warmer.adapters.engines.llamacpp import parse_completion
from warmer.adapters.store import SqlStore
from warmer.api import ApiServices, create_app
from warmer.config.settings import Settings
from warmer.core.capacity import (
    BoxCapacity,
    PrefillCeiling,
    UncachedRate,
    agent_capacity,
    box_capacity,
    ceiling_from_prefill,
    shortfall,
    uncached_rate_between,
)
from warmer.core.hitrate import cache_stats_from_metrics
from warmer.core.model import BoxSpec, CacheStats, EngineKind, ModelProfile
from warmer.core.planner import PlannerConfig
from warmer.core.warm_budget import WarmBudget
from warmer.root.capacity import OfflineStablePrefixes, capacity_config
from warmer.root.metrics import CapacityMetrics, Metrics
from warmer.service.engine_signals.hitrate_monitor import HitRateConfig, HitRateMonitor
from warmer.service.engine_work.restart_warmup import RestartWarmup, long_prefill_target
from warmer.service.reconciler import Reconciler, ReconcilerConfig
from warmer.service.views.capacity import (
    CapacityConfig,
    CapacityReport,
    CapacityService,
    PrefillCeilings,
)

BOX = BoxSpec(id="b1", base_url="http://b1:8080", engine=EngineKind.LLAMACPP, model="m")

# The same llama-server ten seconds later: 4,000 more computed tokens, 16,000 more reused ones.
LLAMACPP_METRICS_LATER = LLAMACPP_METRICS.replace(
    "llamacpp:prompt_tokens_total 300", "llamacpp:prompt_tokens_total 4300"
).replace("llamacpp:prompt_tokens_cached_total 900", "llamacpp:prompt_tokens_cached_total 16900")


# --- the arithmetic ---------------------------------------------------------------------------------------


def test_uncached_rate_from_recorded_llamacpp_counters() -> None:
    before = cache_stats_from_metrics(EngineKind.LLAMACPP, LLAMACPP_METRICS)
    after = cache_stats_from_metrics(EngineKind.LLAMACPP, LLAMACPP_METRICS_LATER)
    rate = uncached_rate_between(before, 100.0, after, 110.0)
    assert rate == UncachedRate(tokens_per_second=400.0, window_seconds=10.0, at=110.0)


def test_uncached_rate_from_recorded_vllm_counters() -> None:
    before = cache_stats_from_metrics(EngineKind.VLLM, VLLM_METRICS)  # 2048 queried, 1536 hit
    later = VLLM_METRICS.replace("} 2048.0", "} 6144.0").replace("} 1536.0", "} 3584.0")
    after = cache_stats_from_metrics(EngineKind.VLLM, later)
    rate = uncached_rate_between(before, 0.0, after, 4.0)
    assert rate is not None
    assert rate.tokens_per_second == pytest.approx(((6144 - 3584) - (2048 - 1536)) / 4.0)


def test_no_rate_after_a_restart_without_counters_or_without_time() -> None:
    high = cache_stats_from_metrics(EngineKind.LLAMACPP, LLAMACPP_METRICS_LATER)
    low = cache_stats_from_metrics(EngineKind.LLAMACPP, LLAMACPP_METRICS)
    assert uncached_rate_between(high, 0.0, low, 10.0) is None  # counters went down: a new process
    assert uncached_rate_between(low, 5.0, high, 5.0) is None
    sglang = cache_stats_from_metrics(EngineKind.SGLANG, SGLANG_METRICS)
    no_counters = CacheStats(queried_tokens=None, hit_tokens=None)
    assert uncached_rate_between(no_counters, 0.0, replace(sglang, queried_tokens=None), 10.0) is None


def test_ceiling_from_a_recorded_llamacpp_long_prefill() -> None:
    body = llamacpp_completion(cache_n=0, prompt_n=4000)
    body["timings"].update(prompt_ms=1600.0, predicted_ms=40.0)
    report = parse_completion(BOX, body, wall_seconds=1.7)
    assert report.prompt_seconds == pytest.approx(1.6)  # prefill alone, not the decode after it
    assert ceiling_from_prefill(report.prompt_tokens, report.cached_tokens, report.prompt_seconds) == 2500.0
    ceilings = PrefillCeilings()
    ceilings.record_long_prefill(BOX, "e1", report)
    assert ceilings.measured("b1", "e1") == 2500.0
    assert ceilings.measured("b1", "e2") is None  # a restarted engine has not been measured
    assert ceiling_from_prefill(100, 100, 0.5) is None  # a full hit computed nothing: no measurement
    assert ceiling_from_prefill(100, 0, None) is None


def test_box_budget_is_the_safe_share_of_the_ceiling_minus_uncached_use() -> None:
    """The seed's box: ~10,000 tokens/s ceiling; latency broke at ~6,000 uncached tokens/s."""
    ceiling = PrefillCeiling(10000.0, "profile")
    stable = box_capacity("b1", ceiling, UncachedRate(2300.0, 60.0, 0.0))
    changing = box_capacity("b1", ceiling, UncachedRate(5800.0, 60.0, 0.0))
    broken = box_capacity("b1", ceiling, UncachedRate(7000.0, 60.0, 0.0))

    assert stable.budget_tokens_per_second == pytest.approx(6000.0)
    assert stable.headroom_tokens_per_second == pytest.approx(3700.0)
    assert changing.headroom_tokens_per_second == pytest.approx(200.0)
    assert broken.headroom_tokens_per_second == pytest.approx(-1000.0)  # over budget shows as negative
    assert broken.utilization == pytest.approx(0.7)
    assert stable.reason is None
    half = box_capacity("b1", ceiling, UncachedRate(2300.0, 60.0, 0.0), safe_fraction=0.5)
    assert half.headroom_tokens_per_second == pytest.approx(2700.0)
    with pytest.raises(ValueError, match="safe_fraction"):
        box_capacity("b1", ceiling, None, safe_fraction=0.0)


def test_a_box_without_a_figure_says_why() -> None:
    unknown = box_capacity("b1", None, None)
    assert unknown.headroom_tokens_per_second is None
    assert unknown.reason is not None
    assert "no prefill ceiling" in unknown.reason
    assert "no uncached-token window" in unknown.reason


def _box(box_id: str, ceiling: float | None, used: float | None) -> BoxCapacity:
    return box_capacity(
        box_id,
        None if ceiling is None else PrefillCeiling(ceiling, "measured"),
        None if used is None else UncachedRate(used, 10.0, 0.0),
    )


def test_agent_headroom_sums_its_measured_routed_boxes() -> None:
    fleet = {
        "b1": _box("b1", 10000.0, 1000.0),  # headroom 5000
        "b2": _box("b2", 5000.0, 500.0),  # headroom 2500
        "b3": _box("b3", None, 100.0),  # no ceiling
    }
    routes = {"sales": ("b1", "b2", "b3"), "support": ("b2",), "idle": ()}
    by_agent = {a.agent_id: a for a in agent_capacity(routes, fleet, uncached_tokens_per_call={"sales": 250})}

    sales = by_agent["sales"]
    assert sales.boxes == ("b1", "b2", "b3")
    assert sales.measured_boxes == ("b1", "b2")
    assert sales.ceiling_tokens_per_second == pytest.approx(15000.0)
    assert sales.budget_tokens_per_second == pytest.approx(9000.0)
    assert sales.used_tokens_per_second == pytest.approx(1500.0)
    assert sales.headroom_tokens_per_second == pytest.approx(7500.0)
    assert sales.calls_per_minute == pytest.approx(7500.0 * 60 / 250)
    assert sales.shares_boxes_with == ("support",)
    assert by_agent["support"].headroom_tokens_per_second == pytest.approx(2500.0)
    assert by_agent["support"].calls_per_minute is None  # no per-call figure given
    assert by_agent["idle"].headroom_tokens_per_second is None
    assert list(by_agent) == ["idle", "sales", "support"]


def test_an_over_budget_group_carries_no_calls() -> None:
    (group,) = agent_capacity(
        {"a": ("b1",)}, {"b1": _box("b1", 1000.0, 900.0)}, uncached_tokens_per_call={"a": 50}
    )
    assert group.headroom_tokens_per_second == pytest.approx(-300.0)
    assert group.calls_per_minute == 0.0


# --- the hit-rate monitor's windows -----------------------------------------------------------------------


class CountingEngine(FakeEngine):
    """The fake engine with llama-server-like cumulative counters the test advances."""

    def __init__(self, box_ids: list[str]) -> None:
        super().__init__(box_ids)
        self.counters = {b: CacheStats(queried_tokens=0.0, hit_tokens=0.0) for b in box_ids}

    def serve(self, box_id: str, *, computed: float, cached: float) -> None:
        c = self.counters[box_id]
        assert c.queried_tokens is not None
        assert c.hit_tokens is not None
        self.counters[box_id] = CacheStats(c.queried_tokens + computed + cached, c.hit_tokens + cached)

    async def cache_stats(self, box: BoxSpec) -> CacheStats:
        return self.counters[box.id]


def test_monitor_keeps_each_boxes_uncached_rate_per_window() -> None:
    engine = CountingEngine(["b1", "b2"])
    clock = FakeClock()
    monitor = HitRateMonitor(
        engine=engine, fleet=lambda: boxes("b1", "b2"), clock=clock, config=HitRateConfig(poll_seconds=10)
    )

    async def scenario() -> None:
        await monitor.scrape_once()
        assert monitor.uncached_rates() == {}  # one scrape is only a baseline
        engine.serve("b1", computed=3000, cached=9000)
        clock.t += 10
        await monitor.scrape_once()
        rates = monitor.uncached_rates()
        assert rates["b1"].tokens_per_second == pytest.approx(300.0)
        assert rates["b2"].tokens_per_second == 0.0
        engine.counters["b1"] = CacheStats(queried_tokens=10.0, hit_tokens=0.0)  # the engine restarted
        clock.t += 10
        await monitor.scrape_once()
        assert "b1" not in monitor.uncached_rates()

    asyncio.run(scenario())


# --- the service over the real reconciler -----------------------------------------------------------------


def _reconciler(
    store_url: str, engine: FakeEngine, clock: FakeClock, ceilings: PrefillCeilings, profile: ModelProfile
) -> tuple[Reconciler, SqlStore]:
    store = SqlStore.from_url(store_url)
    reconciler = Reconciler(
        engine=engine,
        store=store,
        clock=clock,
        boxes=boxes("b1", "b2"),
        profiles={"m": profile},
        agents={"sales": agent("sales")},
        prefix_source=FakePrefixSource(),
        config=ReconcilerConfig(
            planner=PlannerConfig(budget=WarmBudget(max_concurrent=2, tokens_per_second=1e6))
        ),
        restart=RestartWarmup(engine, store, clock, on_long_prefill=ceilings.record_long_prefill),
    )
    return reconciler, store


class Rates:
    def __init__(self, rates: Mapping[str, UncachedRate]) -> None:
        self.rates = dict(rates)

    def uncached_rates(self) -> Mapping[str, UncachedRate]:
        return self.rates


def test_service_measures_ceilings_on_the_warm_up_and_reports_headroom_per_agent(store_url: str) -> None:
    engine, clock, ceilings = CountingEngine(["b1", "b2"]), FakeClock(), PrefillCeilings()
    reconciler, store = _reconciler(store_url, engine, clock, ceilings, PROFILE)
    rates = Rates(
        {
            "b1": UncachedRate(1000.0, 10.0, clock.monotonic()),
            "b2": UncachedRate(0.0, 10.0, clock.monotonic()),
        }
    )
    seen: list[CapacityReport] = []

    class Observer:
        def capacity(self, boxes_: object, agents_: object) -> None:
            seen.append(CapacityReport(0.6, tuple(boxes_), tuple(agents_)))  # type: ignore[arg-type]

    async def calls(agent_id: str) -> int | None:
        return 40 if agent_id == "sales" else None

    service = CapacityService(
        snapshot=reconciler.snapshot,
        usage=rates,
        ceilings=ceilings,
        profiles={"m": PROFILE},
        store=store,
        clock=clock,
        per_call_tokens=calls,
        observer=Observer(),
    )

    async def scenario() -> CapacityReport:
        await settle(reconciler)
        return await service.report()

    report = asyncio.run(scenario())
    # The fake engine answers the long prefill (the 500-token prefix x 1.25 headroom) in 0.01 s.
    target = long_prefill_target(PROFILE.restart, PROFILE, PREFIX_TOKENS)
    boxes_by_id = {b.box_id: b for b in report.boxes}
    for box in boxes_by_id.values():
        assert box.ceiling_source == "measured"
        assert box.ceiling_tokens_per_second == pytest.approx(target / 0.01, rel=0.05)
    b1 = boxes_by_id["b1"]
    assert b1.used_tokens_per_second == 1000.0
    assert b1.headroom_tokens_per_second == pytest.approx(0.6 * b1.ceiling_tokens_per_second - 1000.0)  # type: ignore[operator]
    (sales,) = report.agents
    assert set(sales.boxes) == {"b1", "b2"}
    assert sales.headroom_tokens_per_second == pytest.approx(
        sum(b.headroom_tokens_per_second for b in report.boxes)
    )  # type: ignore[misc]
    assert sales.calls_per_minute == pytest.approx(sales.headroom_tokens_per_second * 60 / 40)  # type: ignore[operator]
    assert seen == [dataclasses.replace(report, shortfall=None)]  # the gauges get every report
    assert report.shortfall is not None
    assert (report.shortfall.agents_kept, report.shortfall.agents_without_room) == (1, ())


def test_a_restarted_daemon_estimates_the_ceiling_from_the_stored_phase(store_url: str) -> None:
    engine, clock = CountingEngine(["b1", "b2"]), FakeClock()
    reconciler, store = _reconciler(store_url, engine, clock, PrefillCeilings(), PROFILE)
    asyncio.run(settle(reconciler))
    fresh = CapacityService(  # what this daemon measured is gone; the store's phase records are not
        snapshot=reconciler.snapshot,
        usage=None,
        ceilings=PrefillCeilings(),
        profiles={"m": PROFILE},
        store=store,
        clock=clock,
    )
    report = asyncio.run(fresh.report())
    # The long prefill was 960 tokens; the record does not say so. The estimate takes the smaller of the
    # warm-up's target and the longest prefix the box serves (PREFIX_TOKENS): low, never high.
    assert long_prefill_target(PROFILE.restart, PROFILE) > PREFIX_TOKENS
    for box in report.boxes:
        assert box.ceiling_source == "warmup_phase"
        assert box.ceiling_tokens_per_second == pytest.approx(PREFIX_TOKENS / 0.01)
        assert box.headroom_tokens_per_second is None  # no counter window yet


def test_a_profile_ceiling_wins_and_stale_windows_do_not_count(store_url: str) -> None:
    engine, clock = CountingEngine(["b1", "b2"]), FakeClock()
    profile = replace(PROFILE, prefill_tokens_per_second=8000.0)
    reconciler, store = _reconciler(store_url, engine, clock, PrefillCeilings(), profile)
    asyncio.run(settle(reconciler))
    rates = Rates({"b1": UncachedRate(500.0, 10.0, clock.monotonic() - 1000.0)})
    service = CapacityService(
        snapshot=reconciler.snapshot,
        usage=rates,
        ceilings=PrefillCeilings(),
        profiles={"m": profile},
        store=store,
        clock=clock,
        config=CapacityConfig(safe_fraction=0.5, max_usage_age_seconds=60.0),
    )
    report = asyncio.run(service.report())
    b1 = next(b for b in report.boxes if b.box_id == "b1")
    assert (b1.ceiling_source, b1.ceiling_tokens_per_second, b1.budget_tokens_per_second) == (
        "profile",
        8000.0,
        4000.0,
    )
    assert b1.used_tokens_per_second is None  # 1000 s old: says nothing about now
    assert report.safe_fraction == 0.5


def test_capacity_settings_reach_the_service_config() -> None:
    settings = Settings.model_validate({"capacity": {"safe_fraction": 0.5, "max_usage_age_seconds": 30}})
    assert capacity_config(settings) == CapacityConfig(safe_fraction=0.5, max_usage_age_seconds=30.0)
    assert capacity_config(Settings()).safe_fraction == 0.6
    with pytest.raises(ValueError, match="safe_fraction"):
        Settings.model_validate({"capacity": {"safe_fraction": 1.5}})


def test_offline_call_tokens_are_the_uncached_part_of_a_turn1_prompt() -> None:
    from warmer.config.agents import load_agent_specs
    from warmer.config.profiles import load_profiles

    repo = Path(__file__).resolve().parents[2]
    agents = load_agent_specs(repo / "config" / "agents")
    profiles = load_profiles(repo / "models")
    prefixes = OfflineStablePrefixes(lambda: agents, profiles)
    fixed = asyncio.run(prefixes.call_tokens("outbound-sales"))
    early = asyncio.run(prefixes.call_tokens("outbound-sales-early"))
    assert fixed is not None
    assert early is not None
    assert 100 < fixed < 400  # the dynamic tail and the generation prompt (3372 - 3114 in `warmer lint`)
    assert early > 3000  # per-call values at the top: almost the whole prompt is computed per call
    assert asyncio.run(prefixes.call_tokens("nobody")) is None
    share = asyncio.run(prefixes.stable_share("outbound-sales"))
    assert share is not None
    assert 0.9 < share < 0.95  # 3114 of 3372 in `warmer lint`


def test_a_report_leaves_the_pre_call_asks_turns_of_the_loop_between_its_steps(store_url: str) -> None:
    """The capacity root task builds a report for every box and agent once per hit-rate window: the
    routes of every agent, then every agent's figures, with a turn of the event loop between the steps."""
    import warmer.service.views.capacity as capacity_module
    from warmer.service.reconciler.types import Snapshot

    engine, clock = CountingEngine(["b1", "b2"]), FakeClock()
    reconciler, store = _reconciler(store_url, engine, clock, PrefillCeilings(), PROFILE)
    asyncio.run(settle(reconciler))
    order: list[str] = []
    real = capacity_module.agent_capacity

    def agent_capacity(*args: object, **kwargs: object) -> object:
        order.append("agents")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    snapshot = reconciler.snapshot

    def snapshotted() -> object:
        order.append("snapshot")
        return snapshot()

    service = CapacityService(
        snapshot=snapshotted,  # type: ignore[arg-type]
        usage=None,
        ceilings=PrefillCeilings(),
        profiles={"m": PROFILE},
        store=store,
        clock=clock,
    )

    async def scenario() -> None:
        done = False

        async def asks() -> None:
            while not done:
                order.append("ask")
                await asyncio.sleep(0)

        beside = asyncio.ensure_future(asks())
        await asyncio.sleep(0)
        order.clear()
        original = capacity_module.agent_capacity
        capacity_module.agent_capacity = agent_capacity  # type: ignore[assignment]
        routes = Snapshot.routes

        def routes_noted(self: Snapshot) -> object:
            order.append("routes")
            return routes(self)

        Snapshot.routes = routes_noted  # type: ignore[method-assign,assignment]
        try:
            await service.report()
        finally:
            capacity_module.agent_capacity = original
            Snapshot.routes = routes  # type: ignore[method-assign]
            done = True
            await beside

    asyncio.run(scenario())
    between = order[order.index("snapshot") : order.index("agents")]
    assert between.count("ask") >= 3  # after the boxes, after the routes, before the agents' figures
    assert order[order.index("routes") : order.index("agents")].count("ask") >= 2  # no await there


def test_per_call_tokens_hash_each_spec_once_until_it_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """The capacity report asks for every agent's per-call tokens once per hit-rate window: a spec that is
    the same (frozen) object is not hashed again (at 1,000 agents that was tens of milliseconds of the
    event loop per report); a replaced spec (a reload) is."""
    import warmer.core.agents as agents_module
    from warmer.config.agents import load_agent_specs
    from warmer.config.profiles import load_profiles

    repo = Path(__file__).resolve().parents[2]
    agents = dict(load_agent_specs(repo / "config" / "agents"))
    profiles = load_profiles(repo / "models")
    prefixes = OfflineStablePrefixes(lambda: agents, profiles)
    hashed: list[str] = []
    real = agents_module.spec_hash

    def counting(spec: agents_module.AgentSpec) -> str:
        hashed.append(spec.id)
        return real(spec)

    monkeypatch.setattr(agents_module, "spec_hash", counting)
    first = [asyncio.run(prefixes.call_tokens("outbound-sales")) for _ in range(3)]
    assert hashed == ["outbound-sales"]
    assert first[0] is not None
    assert first == [first[0]] * 3

    agents["outbound-sales"] = replace(agents["outbound-sales"], source="reloaded")  # same content
    assert asyncio.run(prefixes.call_tokens("outbound-sales")) == first[0]
    assert hashed == ["outbound-sales", "outbound-sales"]


# --- the API and the gauges -------------------------------------------------------------------------------


class FixedCapacity:
    def __init__(self, report: CapacityReport | Exception) -> None:
        self._report = report

    async def report(self) -> CapacityReport:
        if isinstance(self._report, Exception):
            raise self._report
        return self._report


def _get(services: ApiServices, headers: dict[str, str] | None = None) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(services))
        async with httpx.AsyncClient(transport=transport, base_url="http://warmer") as client:
            return await client.get("/v1/capacity", headers=headers)

    return asyncio.run(call())


async def _ready() -> object:
    return None


def test_api_answers_capacity_behind_the_token() -> None:
    fleet = {"b1": _box("b1", 10000.0, 1000.0)}
    agents = tuple(agent_capacity({"sales": ("b1",)}, fleet, uncached_tokens_per_call={"sales": 200}))
    report = CapacityReport(0.6, tuple(fleet.values()), agents)
    services = ApiServices(
        registry=CollectorRegistry(),
        readiness=_ready,  # type: ignore[arg-type]
        tokens=(SecretStr("t"),),
        capacity=FixedCapacity(report),
    )
    assert _get(services).status_code == 401
    body = _get(services, {"authorization": "Bearer t"}).json()
    assert body["safe_fraction"] == 0.6
    sales = body["agents"]["sales"]
    assert sales["boxes"] == ["b1"]
    assert sales["headroom_tokens_per_second"] == pytest.approx(5000.0)
    assert sales["calls_per_minute"] == pytest.approx(1500.0)
    assert body["shortfall"] is None  # no pass yet: nothing known of the demand
    crowded = dataclasses.replace(
        report, shortfall=shortfall({"sales": 3000, "tail": 2900}, {"sales": ("b1",)})
    )
    services = dataclasses.replace(services, capacity=FixedCapacity(crowded))
    body = _get(services, {"authorization": "Bearer t"}).json()
    assert body["shortfall"] == {
        "agents_wanted": 2,
        "agents_kept": 1,
        "agents_without_room": ["tail"],
        "tokens_without_room": 2900,
    }
    assert body["boxes"]["b1"]["ceiling_tokens_per_second"] == 10000.0


def test_api_is_503_without_a_capacity_service() -> None:
    assert _get(ApiServices(registry=CollectorRegistry(), readiness=_ready)).status_code == 503  # type: ignore[arg-type]


def test_gauges_show_unknown_as_nan_and_drop_boxes_that_left() -> None:
    registry = CollectorRegistry()
    gauges = CapacityMetrics(registry)
    two = [_box("b1", 10000.0, 1000.0), _box("b2", None, None)]
    gauges.capacity(two, agent_capacity({"sales": ("b1", "b2")}, {b.box_id: b for b in two}))
    assert registry.get_sample_value("warmer_box_prefill_headroom_tokens_per_second", {"box": "b1"}) == 5000.0
    unknown = registry.get_sample_value("warmer_box_prefill_ceiling_tokens_per_second", {"box": "b2"})
    assert unknown is not None
    assert math.isnan(unknown)
    assert (
        registry.get_sample_value("warmer_agent_prefill_headroom_tokens_per_second", {"agent": "sales"})
        == 5000.0
    )
    gauges.capacity([two[0]], [])
    assert registry.get_sample_value("warmer_box_prefill_ceiling_tokens_per_second", {"box": "b2"}) is None
    assert (
        registry.get_sample_value("warmer_agent_prefill_headroom_tokens_per_second", {"agent": "sales"})
        is None
    )
    assert isinstance(Metrics().capacity, CapacityMetrics)


def test_the_daemon_serves_capacity_when_it_has_boxes(tmp_path: Path) -> None:
    from warmer.root.app import Daemon, build

    box = {"id": "b1", "base_url": "http://127.0.0.1:1", "engine": "llamacpp", "model": "m"}
    database = {"state_dir": str(tmp_path)}
    with_boxes = build(
        Settings.model_validate({"fleet": {"boxes": [box]}, "database": database}), profiles={"m": PROFILE}
    )

    async def opened(daemon: Daemon) -> httpx.Response:
        await daemon.open()  # the store is open and the reconciler built: no pass has run yet
        try:
            assert "/v1/capacity" in daemon.api.openapi()["paths"]
            return await _get_app(daemon.api)
        finally:
            await daemon.close()

    answer = asyncio.run(opened(with_boxes))
    assert answer.status_code == 200
    assert answer.json()["boxes"]["b1"]["ceiling_tokens_per_second"] is None  # nothing measured yet
    empty = asyncio.run(opened(build(Settings.model_validate({"database": database}))))
    assert empty.status_code == 503  # no fleet, nothing to size
    assert empty.json() == {"error": "unavailable", "reason": "capacity is not available"}


async def _get_app(app: object) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://warmer") as client:
        return await client.get("/v1/capacity")
