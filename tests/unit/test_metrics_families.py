"""/metrics of a built daemon exposes every family the front-doors issue asks for, after some activity:
warm requests and outcomes, verification latency, restart phases, boxes ready, prefixes warm, time to
ready, API outcomes by route template, gateway sync outcomes, hit ratio and its alert per box."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from warmer.config.settings import Settings
from warmer.core.model import BoxSpec, CacheLayout, CacheStats, EngineKind
from warmer.core.promtext import parse_prometheus_text
from warmer.root.app import build
from warmer.root.database import ManagedStore
from warmer.root.metrics import HitRateMetrics
from warmer.service.engine_signals.hitrate_monitor import HitRateConfig, HitRateMonitor
from warmer.service.fleet.gateway_sync import GatewaySync

BOX = BoxSpec(id="box-1", base_url="http://10.0.0.1:8000", engine=EngineKind.VLLM, model="m")


class NoStore:
    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None


class Router:
    def __init__(self) -> None:
        self.workers: set[str] = {"http://10.9.9.9:1"}

    async def registered(self) -> set[str]:
        return set(self.workers)

    async def listing(self) -> dict[str, bool]:
        return dict.fromkeys(self.workers, True)

    async def register(self, box: BoxSpec) -> None:
        self.workers.add(box.base_url)

    async def deregister(self, box: BoxSpec) -> None:
        self.workers.discard(box.base_url)


class Ready:
    def ready_box_ids(self) -> set[str] | None:
        return {BOX.id}

    async def wait_changed(self) -> None:
        return None


class Counters:
    def __init__(self) -> None:
        self.queried, self.hits = 0.0, 0.0

    async def cache_layout(self, box: BoxSpec) -> CacheLayout:
        return CacheLayout()

    async def cache_stats(self, box: BoxSpec) -> CacheStats:
        return CacheStats(queried_tokens=self.queried, hit_tokens=self.hits)


class Clock:
    def now(self) -> float:
        return 0.0

    def monotonic(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        return None


def test_metrics_expose_every_required_family(tmp_path: Path) -> None:
    async def scenario() -> None:
        def store(_: Settings) -> ManagedStore:
            return NoStore()  # type: ignore[return-value]

        daemon = build(
            Settings(database={"state_dir": str(tmp_path)}), store_factory=store, prepare=lambda _: None
        )
        await daemon.open()  # the API is built over the open store
        metrics = daemon.metrics

        # the reconciler's observer (its own tests drive it through the real loop)
        metrics.reconcile.warm_finished(BOX.id, "warm", "assigned", "verified", 0.2)
        metrics.reconcile.warm_tokens(BOX.id, 1200)
        metrics.reconcile.phase_finished(BOX.id, "sampled", True, 1.5)
        metrics.reconcile.box_ready(BOX.id, 12.0, 11.0)
        metrics.reconcile.fleet_state(1, 3)
        metrics.reconcile.box_states(
            {BOX.id: True, "gone": False}, {(BOX.id, "sales"): True, ("gone", "sales"): False}
        )
        metrics.reconcile.box_states({BOX.id: True}, {(BOX.id, "sales"): True})  # "gone" left the fleet

        sync = GatewaySync(
            gateway=Router(),
            fleet=lambda: [BOX],
            readiness=Ready(),
            clock=Clock(),
            interval_seconds=5,
            observer=metrics.gateway,
        )
        await sync.sync_once()

        counters = Counters()
        monitor = HitRateMonitor(
            engine=counters,  # type: ignore[arg-type]  # only cache_stats is used
            fleet=lambda: [BOX],
            clock=Clock(),
            config=HitRateConfig(min_tokens_per_window=100),
            observer=metrics.hitrate,
        )
        await monitor.scrape_once()
        counters.queried, counters.hits = 1000.0, 500.0
        await monitor.scrape_once()

        transport = httpx.ASGITransport(app=daemon.api)
        async with httpx.AsyncClient(transport=transport, base_url="http://warmer") as client:
            assert (await client.get("/healthz")).status_code == 200
            assert (await client.get("/no/such/path")).status_code == 404
            text = (await client.get("/metrics")).text

        samples = parse_prometheus_text(text)

        def value(name: str, **labels: str) -> float:
            found = [
                s.value
                for s in samples
                if s.name == name and all(dict(s.labels).get(k) == v for k, v in labels.items())
            ]
            assert found, f"{name}{labels} missing from /metrics"
            return found[0]

        assert value("warmer_warm_requests_total", kind="warm", outcome="verified") == 1
        assert value("warmer_warm_verify_seconds_count", kind="warm") == 1
        assert value("warmer_restart_phase_seconds_count", phase="sampled", ok="true") == 1
        assert value("warmer_boxes_ready") == 1
        assert value("warmer_prefixes_warm") == 3
        assert value("warmer_time_to_ready_seconds", box=BOX.id) == 12
        assert value("warmer_box_ready", box=BOX.id) == 1
        assert value("warmer_box_agent_warm", box=BOX.id, agent="sales") == 1
        assert not [s for s in samples if dict(s.labels).get("box") == "gone"], (
            "a removed box keeps no series"
        )
        assert not [s for s in samples if s.name.endswith("_created")], "no *_created series"
        assert value("warmer_http_requests_total", route="/healthz", method="GET", status="2xx") == 1
        assert value("warmer_http_requests_total", route="unmatched", method="GET", status="4xx") == 1
        assert value("warmer_http_request_seconds_count", route="/healthz") == 1
        assert value("warmer_gateway_sync_passes_total", outcome="ok") == 1
        assert value("warmer_gateway_sync_seconds_count") == 1
        assert value("warmer_gateway_worker_changes_total", action="register", outcome="ok") == 1
        assert value("warmer_gateway_workers", owner="foreign") == 1
        assert value("warmer_box_cache_hit_ratio", box=BOX.id) == pytest.approx(0.5)
        assert value("warmer_box_hit_rate_below_threshold", box=BOX.id) == 1
        assert value("warmer_cache_scrapes_total", outcome="ok") == 2
        assert value("warmer_engine_prompt_tokens_total", box=BOX.id, cached="true") == 500
        assert value("warmer_engine_prompt_tokens_total", box=BOX.id, cached="false") == 500
        assert value("warmer_warm_prompt_tokens_total", box=BOX.id) == 1200
        # Failure counters an alert reads by increase exist at 0 before the first failure: a root task
        # that fails once and stops the daemon is then an increase, not a series born at 1.
        assert daemon.supervisor.task_names == ("api", "loop-lag")
        assert value("warmer_root_task_failures_total", task="api") == 0
        assert value("warmer_gateway_sync_passes_total", outcome="gateway_unavailable") == 0
        assert value("warmer_cache_scrapes_total", outcome="failed") == 0
        assert value("warmer_discovery_listings_total", outcome="failed") == 0
        await daemon.close()

    asyncio.run(scenario())


def test_route_templates_keep_label_values_bounded(tmp_path: Path) -> None:
    async def scenario() -> None:
        def store(_: Settings) -> ManagedStore:
            return NoStore()  # type: ignore[return-value]

        daemon = build(
            Settings(database={"state_dir": str(tmp_path)}), store_factory=store, prepare=lambda _: None
        )
        await daemon.open()  # the API is built over the open store
        transport = httpx.ASGITransport(app=daemon.api)
        async with httpx.AsyncClient(transport=transport, base_url="http://warmer") as client:
            for box_id in ("x1", "x2", "x3"):
                await client.get(f"/v1/boxes/{box_id}/ready")
            text = (await client.get("/metrics")).text
        routes = {
            dict(s.labels)["route"]
            for s in parse_prometheus_text(text)
            if s.name == "warmer_http_requests_total"
        }
        assert "/v1/boxes/{box_id}/ready" in routes
        assert not any("x1" in route for route in routes)
        await daemon.close()

    asyncio.run(scenario())


def test_a_healthy_box_shows_its_alert_at_0_from_its_first_judged_window() -> None:
    """The alert gauge is a series from the box's first judged window, not from its first crossing: a
    box that never dropped below the threshold reads 0 on the dashboard, not "no data"."""
    registry = CollectorRegistry()
    metrics = HitRateMetrics(registry)
    counters = Counters()
    monitor = HitRateMonitor(
        engine=counters,  # type: ignore[arg-type]  # only cache_stats is used
        fleet=lambda: [BOX],
        clock=Clock(),
        config=HitRateConfig(min_tokens_per_window=100),
        observer=metrics,
    )
    asyncio.run(monitor.scrape_once())
    counters.queried, counters.hits = 1000.0, 990.0
    asyncio.run(monitor.scrape_once())
    assert registry.get_sample_value("warmer_box_cache_hit_ratio", {"box": BOX.id}) == pytest.approx(0.99)
    assert registry.get_sample_value("warmer_box_hit_rate_below_threshold", {"box": BOX.id}) == 0
