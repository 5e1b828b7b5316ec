"""The hit-rate monitor over a fake engine's counters: judged windows, an alert once per crossing, idle
boxes never alert, a restart re-baselines, scrape failures keep the baseline."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from warmer.core.errors import EngineUnavailable, NotSupported
from warmer.core.hitrate import HitRateStatus
from warmer.core.model import BoxSpec, CacheLayout, CacheStats, EngineKind
from warmer.service.engine_signals.hitrate_monitor import (
    EVENT_BELOW,
    EVENT_RECOVERED,
    HitRateConfig,
    HitRateMonitor,
)

A = BoxSpec(id="a", base_url="http://a:1", engine=EngineKind.VLLM, model="m")
B = BoxSpec(id="b", base_url="http://b:1", engine=EngineKind.VLLM, model="m")


class CountingEngine:
    """Cumulative counters per box, advanced by `serve`; `fail` makes the next scrapes raise."""

    def __init__(self) -> None:
        self.counters: dict[str, list[float]] = {"a": [0.0, 0.0], "b": [0.0, 0.0]}
        self.fail: dict[str, Exception] = {}

    def serve(self, box_id: str, queried: float, hits: float) -> None:
        self.counters[box_id][0] += queried
        self.counters[box_id][1] += hits

    def restart(self, box_id: str) -> None:
        self.counters[box_id] = [0.0, 0.0]

    async def cache_layout(self, box: BoxSpec) -> CacheLayout:
        return CacheLayout()

    async def cache_stats(self, box: BoxSpec) -> CacheStats:
        if box.id in self.fail:
            raise self.fail[box.id]
        queried, hits = self.counters[box.id]
        return CacheStats(queried_tokens=queried, hit_tokens=hits)


class Recorder:
    def __init__(self) -> None:
        self.ratios: list[tuple[str, float]] = []
        self.alerts: list[tuple[str, bool]] = []
        self.scrapes: list[tuple[str, str]] = []
        self.windows: list[tuple[str, float, float]] = []
        self.suspects: list[tuple[str, bool]] = []

    def hit_ratio(self, box_id: str, ratio: float) -> None:
        self.ratios.append((box_id, ratio))

    def alert(self, box_id: str, below_threshold: bool) -> None:
        self.alerts.append((box_id, below_threshold))

    def scrape_finished(self, box_id: str, outcome: str) -> None:
        self.scrapes.append((box_id, outcome))

    def window_tokens(self, box_id: str, queried_tokens: float, hit_tokens: float) -> None:
        self.windows.append((box_id, queried_tokens, hit_tokens))

    def set_suspect(self, box_id: str, suspect: bool) -> None:
        self.suspects.append((box_id, suspect))


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps = 0

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.t += seconds
        await asyncio.sleep(0)


def make(engine: CountingEngine, recorder: Recorder, *, boxes: list[BoxSpec] | None = None) -> HitRateMonitor:
    fleet = boxes if boxes is not None else [A, B]
    return HitRateMonitor(
        engine=engine,  # type: ignore[arg-type]  # only cache_stats is used
        fleet=lambda: fleet,
        clock=FakeClock(),
        config=HitRateConfig(poll_seconds=60, threshold=0.9, min_tokens_per_window=1000),
        observer=recorder,
        suspects=recorder,
    )


def test_alert_once_per_crossing_with_a_log_event_and_suspect_feed() -> None:
    async def scenario() -> None:
        engine, recorder = CountingEngine(), Recorder()
        monitor = make(engine, recorder)
        first = await monitor.scrape_once()
        assert first["a"].status is HitRateStatus.NO_DATA  # a baseline only

        with capture_logs() as logs:
            engine.serve("a", 10000, 9500)  # 95%: healthy
            engine.serve("b", 10000, 9900)
            ok = await monitor.scrape_once()
            engine.serve("a", 10000, 6000)  # 60%: evicted
            below = await monitor.scrape_once()
            engine.serve("a", 20000, 10000)  # still bad: no second event
            still = await monitor.scrape_once()
            engine.serve("a", 10000, 9800)
            recovered = await monitor.scrape_once()

        assert ok["a"].status is HitRateStatus.OK
        assert ok["a"].hit_rate == pytest.approx(0.95)
        assert below["a"].status is HitRateStatus.BELOW_THRESHOLD
        assert below["a"].hit_rate == pytest.approx(0.6)
        assert below["a"].alerting
        assert still["a"].hit_rate == pytest.approx(0.5)
        assert not recovered["a"].alerting
        assert not below["b"].alerting

        a_ratios = [ratio for box, ratio in recorder.ratios if box == "a"]
        assert a_ratios == pytest.approx([0.95, 0.6, 0.5, 0.98])
        assert recorder.alerts == [("a", True), ("a", False)]
        assert recorder.suspects == [("a", True), ("a", False)]
        events = [(entry["event"], entry.get("box")) for entry in logs]
        assert events.count((EVENT_BELOW, "a")) == 1
        assert events.count((EVENT_RECOVERED, "a")) == 1
        below_event = next(entry for entry in logs if entry["event"] == EVENT_BELOW)
        assert below_event["hit_rate"] == pytest.approx(0.6)
        assert below_event["threshold"] == 0.9
        assert below_event["log_level"] == "warning"

    asyncio.run(scenario())


def test_an_idle_box_never_alerts() -> None:
    async def scenario() -> None:
        engine, recorder = CountingEngine(), Recorder()
        monitor = make(engine, recorder)
        await monitor.scrape_once()
        engine.serve("a", 300, 0)  # a few health checks / cold probes: 0% but only 300 tokens
        result = await monitor.scrape_once()
        assert result["a"].status is HitRateStatus.NO_DATA
        assert result["a"].hit_rate == 0.0
        assert recorder.alerts == []
        assert recorder.ratios == []

    asyncio.run(scenario())


def test_an_idle_window_clears_an_alert() -> None:
    async def scenario() -> None:
        engine, recorder = CountingEngine(), Recorder()
        monitor = make(engine, recorder)
        await monitor.scrape_once()
        engine.serve("a", 10000, 1000)
        await monitor.scrape_once()
        assert monitor.alerting() == {"a"}
        with capture_logs() as logs:
            engine.serve("a", 300, 0)  # the calls stopped: a few probes, too little to judge
            assert (await monitor.scrape_once())["a"].status is HitRateStatus.NO_DATA
        assert monitor.alerting() == set()
        assert recorder.alerts == [("a", True), ("a", False)]
        assert ("a", False) in recorder.suspects
        assert [e["reason"] for e in logs if e["event"] == EVENT_RECOVERED] == [
            "idle: too little traffic to judge"
        ]

    asyncio.run(scenario())


def test_a_restart_clears_an_alert_without_judging_warmup() -> None:
    async def scenario() -> None:
        engine, recorder = CountingEngine(), Recorder()
        monitor = make(engine, recorder)
        engine.serve("a", 50000, 45000)
        await monitor.scrape_once()
        engine.serve("a", 10000, 1000)
        await monitor.scrape_once()
        assert monitor.alerting() == {"a"}

        engine.restart("a")
        engine.serve("a", 8000, 100)  # the restart warm-up: cold by design, must not alert
        result = await monitor.scrape_once()
        assert result["a"].counters_reset
        assert result["a"].status is HitRateStatus.NO_DATA
        assert monitor.alerting() == set()
        assert recorder.alerts == [("a", True), ("a", False)]

        engine.serve("a", 10000, 9500)  # judged from the new baseline
        assert (await monitor.scrape_once())["a"].hit_rate == pytest.approx(0.95)

    asyncio.run(scenario())


def test_scrape_failures_are_survived_logged_once_and_keep_the_baseline() -> None:
    async def scenario() -> None:
        engine, recorder = CountingEngine(), Recorder()
        monitor = make(engine, recorder, boxes=[A])
        await monitor.scrape_once()
        engine.fail["a"] = EngineUnavailable("a", "connection refused")
        with capture_logs() as logs:
            engine.serve("a", 5000, 1000)
            failed = await monitor.scrape_once()
            await monitor.scrape_once()
        assert failed["a"].error is not None
        assert [entry["event"] for entry in logs].count("cache counter scrape failed") == 1
        del engine.fail["a"]
        engine.serve("a", 5000, 4000)
        window = (await monitor.scrape_once())["a"]
        assert window.queried_tokens == 10000  # both chunks: the baseline survived the failures
        assert window.hit_rate == pytest.approx(0.5)
        assert recorder.scrapes == [("a", "ok"), ("a", "failed"), ("a", "failed"), ("a", "ok")]

        engine.fail["a"] = NotSupported("a", "llama-server /metrics is off")
        assert (await monitor.scrape_once())["a"].error is not None
        assert recorder.scrapes[-1] == ("a", "unsupported")

    asyncio.run(scenario())


def test_a_box_leaving_the_fleet_drops_its_alert() -> None:
    async def scenario() -> None:
        engine, recorder = CountingEngine(), Recorder()
        fleet = [A, B]
        monitor = make(engine, recorder, boxes=fleet)
        await monitor.scrape_once()
        engine.serve("b", 10000, 0)
        await monitor.scrape_once()
        assert monitor.alerting() == {"b"}
        fleet.remove(B)
        assert set(await monitor.scrape_once()) == {"a"}
        assert monitor.alerting() == set()
        assert recorder.alerts[-1] == ("b", False)

    asyncio.run(scenario())


def test_run_scrapes_every_poll_until_stopped() -> None:
    async def scenario() -> None:
        engine, recorder = CountingEngine(), Recorder()
        clock = FakeClock()
        monitor = HitRateMonitor(
            engine=engine,  # type: ignore[arg-type]
            fleet=lambda: [A],
            clock=clock,
            config=HitRateConfig(poll_seconds=60),
            observer=recorder,
        )
        stopping = asyncio.Event()
        running = asyncio.create_task(monitor.run(stopping))
        for _ in range(200):
            if len(recorder.scrapes) >= 3:
                break
            await asyncio.sleep(0)
        stopping.set()
        await asyncio.wait_for(running, timeout=5)
        assert len(recorder.scrapes) >= 3
        assert clock.t >= 120  # the polls were spaced by the fake clock, not real time

    asyncio.run(scenario())


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="threshold"):
        HitRateConfig(threshold=1.5)
    with pytest.raises(ValueError, match="poll_seconds"):
        HitRateConfig(poll_seconds=0)


def test_every_window_of_one_process_reports_its_tokens_even_when_too_small_to_judge() -> None:
    async def scenario() -> None:
        engine, recorder = CountingEngine(), Recorder()
        monitor = make(engine, recorder, boxes=[A])
        await monitor.scrape_once()  # baseline: no window yet
        engine.serve("a", 200, 150)  # under min_tokens_per_window: not judged, still counted
        await monitor.scrape_once()
        engine.restart("a")  # counters went down: a new baseline, no window
        await monitor.scrape_once()
        engine.serve("a", 5000, 4000)
        await monitor.scrape_once()
        assert recorder.windows == [("a", 200, 150), ("a", 5000, 4000)]

    asyncio.run(scenario())


def test_windows_while_warmer_warms_the_box_are_not_judged() -> None:
    """A restart warm-up or a first prefix warm is cold by design: only windows with the box ready for
    traffic at both ends say something about the calls."""

    async def scenario() -> None:
        engine, recorder = CountingEngine(), Recorder()
        ready: set[str] = set()
        monitor = HitRateMonitor(
            engine=engine,  # type: ignore[arg-type]  # only cache_stats is used
            fleet=lambda: [A],
            clock=FakeClock(),
            config=HitRateConfig(poll_seconds=60, threshold=0.9, min_tokens_per_window=1000),
            observer=recorder,
            ready_boxes=lambda: ready,
        )
        await monitor.scrape_once()
        engine.serve("a", 20000, 500)  # warm-up: long prefill, bursts, first warms
        assert (await monitor.scrape_once())["a"].status is HitRateStatus.NO_DATA
        ready.add("a")
        engine.serve("a", 5000, 0)  # became ready during this window: still warmer's traffic in it
        assert (await monitor.scrape_once())["a"].status is HitRateStatus.NO_DATA
        assert recorder.alerts == []
        engine.serve("a", 10000, 6000)  # ready at both ends: the calls' own hit rate, judged
        assert (await monitor.scrape_once())["a"].status is HitRateStatus.BELOW_THRESHOLD
        assert recorder.alerts == [("a", True)]
        assert [w[1] for w in recorder.windows] == [20000, 5000, 10000]  # counted all along

    asyncio.run(scenario())


def test_the_fleets_readiness_is_read_once_a_round_not_once_a_box() -> None:
    """Which boxes are ready is a walk over every agent: a round over the fleet reads it once for all its
    boxes, and judges each by it as before."""

    async def scenario() -> None:
        engine, recorder = CountingEngine(), Recorder()
        reads: list[int] = []

        def ready_boxes() -> set[str]:
            reads.append(1)
            return {"a"}

        monitor = HitRateMonitor(
            engine=engine,  # type: ignore[arg-type]  # only cache_stats is used
            fleet=lambda: [A, B],
            clock=FakeClock(),
            config=HitRateConfig(poll_seconds=60, threshold=0.9, min_tokens_per_window=1000),
            observer=recorder,
            ready_boxes=ready_boxes,
        )
        await monitor.scrape_once()
        engine.serve("a", 10000, 6000)
        engine.serve("b", 10000, 6000)
        second = await monitor.scrape_once()
        assert len(reads) == 2  # one read per round, with two boxes in each
        assert second["a"].status is HitRateStatus.BELOW_THRESHOLD  # ready at both ends: judged
        assert second["b"].status is HitRateStatus.NO_DATA  # never ready: warmer's own traffic

    asyncio.run(scenario())
