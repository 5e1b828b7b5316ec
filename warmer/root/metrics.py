"""The daemon's Prometheus metrics, on a registry of its own (never the process-global default one).

One registry per app means two daemons in one test process never collide, and /metrics shows exactly
what this daemon registered. Features add their counters and gauges as attributes here.

Size: every metric family the daemon exports, each name and help text defined once, in the one module the
dashboard and alert tests check their queries against.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

import warmer
from warmer.core.call_report import CallUsageReport
from warmer.core.capacity import AgentCapacity, BoxCapacity
from warmer.service.fleet.gateway_sync import SyncOutcome
from warmer.service.reconciler.types import BoxSeen

# `*_created` series (one per counter/histogram child) double the series count and no dashboard or alert
# of ours reads them. The switch is process-wide in prometheus_client, as is this module.
# What `warmer_engine_control_requests_total{kind}` counts (`warmer.adapters.engines.dispatch`).
CONTROL_KINDS = ("health", "epoch", "capacity", "metrics")

disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated


class Metrics:
    """Every metric the daemon exports, registered on `self.registry`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        # Standard process_* (CPU, memory, fds, start time) and python_info, as the default registry has.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.build_info = Info("warmer_build", "Version of the running warmer.", registry=self.registry)
        self.build_info.info({"version": warmer.__version__})
        self.up = Gauge("warmer_up", "1 while the daemon is started and serving.", registry=self.registry)
        self.ready = Gauge(
            "warmer_ready",
            "1 while the daemon is started, not stopping, and its database answered the last check "
            "(made on every /readyz and every /metrics scrape).",
            registry=self.registry,
        )
        self.root_task_failures = Counter(
            "warmer_root_task_failures",
            "Root tasks that ended on their own (a fatal condition: the daemon then stops).",
            ["task"],
            registry=self.registry,
        )
        self.engine_control_requests = Counter(
            "warmer_engine_control_requests",
            "HTTP requests this replica sent engines to read their health, epoch, capacity or metrics "
            "(kind), retries included: divide the fleet's rate by the boxes for control traffic per box. "
            "Only a box's lease holder polls its health and epoch.",
            ["kind"],
            registry=self.registry,
        )
        for kind in CONTROL_KINDS:  # every kind at 0 from the start: a rate needs the series before its first
            self.engine_control_requests.labels(kind=kind)
        self.loop_lag = Histogram(
            "warmer_event_loop_lag_seconds",
            "How much later than due a 100 ms timer on the daemon's event loop fired: the time the loop was "
            "held by other work (a pass, a poll round, a garbage collection), which every pre-call ask "
            "arriving meanwhile waits too.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=self.registry,
        )
        self.reconcile = ReconcileMetrics(self.registry)
        self.discovery = DiscoveryMetrics(self.registry)
        self.gateway = GatewaySyncMetrics(self.registry)
        self.hitrate = HitRateMetrics(self.registry)
        self.capacity = CapacityMetrics(self.registry)
        self.usage = UsageMetrics(self.registry)
        self.http = HttpMetrics(self.registry)


class ReconcileMetrics:
    """The reconciler's `ReconcileObserver`, on the daemon's own registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.warm_requests = Counter(
            "warmer_warm_requests",
            "Warms and probes finished, by kind (warm|probe), why they were sent, and outcome.",
            ["kind", "reason", "outcome"],
            registry=registry,
        )
        self.warm_prompt_tokens = Counter(
            "warmer_warm_prompt_tokens",
            "Prompt tokens the daemon itself sent in warm and probe requests (prefix tokens x requests), "
            "per box: its own load on the engines, to set against the calls' prefill.",
            ["box"],
            registry=registry,
        )
        self.verify_seconds = Histogram(
            "warmer_warm_verify_seconds",
            "Wall seconds of one warm-and-verify or probe, engine round trips included.",
            ["kind"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=registry,
        )
        self.phase_seconds = Histogram(
            "warmer_restart_phase_seconds",
            "Wall seconds of each restart warm-up phase, by phase and success.",
            ["phase", "ok"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=registry,
        )
        self.pass_seconds = Histogram(
            "warmer_reconcile_pass_seconds",
            "Wall seconds of one pass under the fleet lock, by kind: full (a reconcile pass: observe, "
            "plan, dispatch) or health (the health timer's poll of the boxes this replica polls).",
            ["kind"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=registry,
        )
        self.boxes_ready = Gauge("warmer_boxes_ready", "Boxes ready for traffic now.", registry=registry)
        self.engine_work_queued = Gauge(
            "warmer_engine_work_queued",
            "Engine work waiting for the fleet warming budget, by kind (restart_warmup, warm, probe): after "
            "a region restart, how far behind warming is.",
            ["kind"],
            registry=registry,
        )
        self.engine_work_running = Gauge(
            "warmer_engine_work_running",
            "Engine work the fleet pacer has admitted and not yet seen finish (restart warm-ups, warms, "
            "probes), at most reconcile.fleet_warm_max_in_flight beside pre-call warms.",
            registry=registry,
        )
        self.fleet_budget_rate = Gauge(
            "warmer_fleet_warm_budget_tokens_per_second",
            "The fleet warming budget in force: uncached prompt tokens per second all engine work may spend.",
            registry=registry,
        )
        self.fleet_budget_available = Gauge(
            "warmer_fleet_warm_budget_tokens_available",
            "Uncached tokens left in the fleet warming budget's bucket now (negative: debt pre-call warms or "
            "an oversized piece left; waiting work goes once refill pays it).",
            registry=registry,
        )
        self.box_ready_state = Gauge(
            "warmer_box_ready",
            "1 while the box is ready for traffic (restart warm-up done, its agents' prefixes warm in its "
            "current epoch), else 0; one series per fleet box.",
            ["box"],
            registry=registry,
        )
        self.box_agent_warm = Gauge(
            "warmer_box_agent_warm",
            "1 while the agent's current prefix is verified warm on the box in its current epoch, else 0; "
            "one series per box the agent is assigned or routed to.",
            ["box", "agent"],
            registry=registry,
        )
        self._ready_labels: set[str] = set()
        self._warm_labels: set[tuple[str, str]] = set()
        self._ready_values: dict[str, int] = {}  # what each series was last set to
        self._warm_values: dict[tuple[str, str], int] = {}
        self.box_healthy = Gauge(
            "warmer_box_healthy",
            "1 while the box answers its health poll (and its process identity is read), else 0.",
            ["box"],
            registry=registry,
        )
        self.box_health_failure = Gauge(
            "warmer_box_health_failure",
            "1 for how the box's last health poll failed (kind: refused, connect_timeout, unreachable, "
            "timeout, http_status, unhealthy, epoch, stale); no series while it is healthy.",
            ["box", "kind"],
            registry=registry,
        )
        self.box_info = Gauge(
            "warmer_box_info",
            "Always 1: the box's engine, model profile, placement group and the engine's own version "
            "(empty where the engine does not report it), to join onto any per-box series.",
            ["box", "engine", "model", "group", "version"],
            registry=registry,
        )
        self._healthy_labels: set[str] = set()
        self._healthy_values: dict[str, int] = {}
        self._failure_labels: set[tuple[str, str]] = set()
        self._info_labels: set[tuple[str, str, str, str, str]] = set()
        self.prefixes_warm = Gauge(
            "warmer_prefixes_warm",
            "(box, prefix) pairs verified warm in the boxes' current epochs.",
            registry=registry,
        )
        self.time_to_ready = Gauge(
            "warmer_time_to_ready_seconds",
            "Last epoch of each box: wall seconds from health seen up to ready (warm-up + prefixes).",
            ["box"],
            registry=registry,
        )
        self.warmup_engine = Gauge(
            "warmer_warmup_engine_seconds",
            "Last epoch of each box: engine-reported seconds its warm-up and prefix requests took "
            "(time_to_ready minus this is the daemon's own overhead).",
            ["box"],
            registry=registry,
        )
        self.tokenizer_drift_ratio = Gauge(
            "warmer_tokenizer_drift_ratio",
            "Relative change in the token count of an agent's unchanged prefix text since the previous "
            "engine/tokenizer version (e.g. 0.08 = 8% more tokens), set when it exceeds the drift threshold.",
            ["agent", "model"],
            registry=registry,
        )
        self.gate_released_state = Gauge(
            "warmer_box_gate_released",
            "1 while the admission gate (/v1/boxes/{id}/admit) lets the box in although it is not ready, "
            "by rule: latched (ready earlier in this engine epoch), held_too_long ([gate] max_hold_seconds), "
            "share (holding it would hold out too much of its model or group).",
            ["box", "rule"],
            registry=registry,
        )
        self._released_labels: set[tuple[str, str]] = set()
        self.tokenizer_drifts = Counter(
            "warmer_tokenizer_drift",
            "Tokenizer drift findings raised, per model (one per agent prefix that drifted).",
            ["model"],
            registry=registry,
        )

    def warm_finished(self, box_id: str, kind: str, reason: str, outcome: str, seconds: float) -> None:
        self.warm_requests.labels(kind=kind, reason=reason, outcome=outcome).inc()
        self.verify_seconds.labels(kind=kind).observe(seconds)

    def warm_tokens(self, box_id: str, tokens: int) -> None:
        self.warm_prompt_tokens.labels(box=box_id).inc(max(0, tokens))

    def phase_finished(self, box_id: str, phase: str, ok: bool, seconds: float) -> None:
        self.phase_seconds.labels(phase=phase, ok=str(ok).lower()).observe(seconds)

    def box_ready(self, box_id: str, time_to_ready_seconds: float, engine_seconds: float) -> None:
        self.time_to_ready.labels(box=box_id).set(time_to_ready_seconds)
        self.warmup_engine.labels(box=box_id).set(engine_seconds)

    def boxes_seen(self, boxes: Sequence[BoxSeen]) -> None:
        current_health = {(b.box_id, b.failure) for b in boxes if b.failure is not None}
        current_info = {(b.box_id, b.engine, b.model, b.group, b.version) for b in boxes}
        for failed in self._failure_labels - current_health:  # a box up again, or failing another way
            self.box_health_failure.remove(*failed)
        for info in self._info_labels - current_info:  # left the fleet, or a new engine version
            self.box_info.remove(*info)
        for box_id in self._healthy_labels - {b.box_id for b in boxes}:
            self.box_healthy.remove(box_id)
        # Only what changed is set: a pass reports every box, and a labelled set is microseconds each.
        healthy = {b.box_id: 1 if b.healthy else 0 for b in boxes}
        for box_id, value in healthy.items():
            if self._healthy_values.get(box_id) != value:
                self.box_healthy.labels(box=box_id).set(value)
        for info in current_info - self._info_labels:
            self.box_info.labels(*info).set(1)
        for box_id, failure in current_health - self._failure_labels:
            self.box_health_failure.labels(box=box_id, kind=failure).set(1)
        self._failure_labels, self._info_labels = current_health, current_info
        self._healthy_labels = set(healthy)
        self._healthy_values = healthy

    def pass_finished(self, kind: str, seconds: float) -> None:
        self.pass_seconds.labels(kind=kind).observe(seconds)

    def fleet_state(self, boxes_ready: int, prefixes_warm: int) -> None:
        self.boxes_ready.set(boxes_ready)
        self.prefixes_warm.set(prefixes_warm)

    def box_states(self, ready: Mapping[str, bool], agent_warm: Mapping[tuple[str, str], bool]) -> None:
        for box_id in self._ready_labels - set(ready):  # left the fleet: no series stuck at its last value
            self.box_ready_state.remove(box_id)
        for box_id, agent_id in self._warm_labels - set(agent_warm):
            self.box_agent_warm.remove(box_id, agent_id)
        # Only what changed is set: one series per (box, agent) is thousands of labelled sets a pass.
        ready_values = {box_id: 1 if is_ready else 0 for box_id, is_ready in ready.items()}
        for box_id, value in ready_values.items():
            if self._ready_values.get(box_id) != value:
                self.box_ready_state.labels(box=box_id).set(value)
        warm_values = {key: 1 if is_warm else 0 for key, is_warm in agent_warm.items()}
        for (box_id, agent_id), value in warm_values.items():
            if self._warm_values.get((box_id, agent_id)) != value:
                self.box_agent_warm.labels(box=box_id, agent=agent_id).set(value)
        self._ready_labels = set(ready_values)
        self._warm_labels = set(warm_values)
        self._ready_values, self._warm_values = ready_values, warm_values

    def gate_released(self, released: Mapping[str, str]) -> None:
        labels = set(released.items())
        for box_id, rule in self._released_labels - labels:
            self.gate_released_state.remove(box_id, rule)
        for box_id, rule in labels:
            self.gate_released_state.labels(box=box_id, rule=rule).set(1)
        self._released_labels = labels

    def tokenizer_drift(self, agent_id: str, model: str, change: float) -> None:
        self.tokenizer_drift_ratio.labels(agent=agent_id, model=model).set(change)
        self.tokenizer_drifts.labels(model=model).inc()

    def engine_work_paced(
        self, queued: Mapping[str, int], running: int, tokens_per_second: float, tokens_available: float
    ) -> None:
        for kind, count in queued.items():
            self.engine_work_queued.labels(kind=kind).set(count)
        self.engine_work_running.set(running)
        self.fleet_budget_rate.set(tokens_per_second)
        self.fleet_budget_available.set(tokens_available)


class DiscoveryMetrics:
    """Fleet discovery's `DiscoveryObserver`: listings by outcome and the boxes they found."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.listings = Counter(
            "warmer_discovery_listings",
            "Listings of the discovery source (the Kubernetes API), by outcome (ok, failed).",
            ["outcome"],
            registry=registry,
        )
        for outcome in ("ok", "failed"):  # at 0 from the start, for the alert's increase
            self.listings.labels(outcome=outcome)
        self.boxes = Gauge(
            "warmer_discovery_boxes",
            "Boxes the last successful listing found and the daemon keeps in its fleet.",
            registry=registry,
        )

    def listed(self, ok: bool, boxes: int | None) -> None:
        self.listings.labels(outcome="ok" if ok else "failed").inc()
        if boxes is not None:
            self.boxes.set(boxes)


class GatewaySyncMetrics:
    """Gateway sync's `GatewaySyncObserver`: passes, worker adds/removes and what the router listed."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.passes = Counter(
            "warmer_gateway_sync_passes",
            "Gateway sync passes, by outcome (ok, partial, gateway_unavailable, readiness_unknown).",
            ["outcome"],
            registry=registry,
        )
        self.pass_seconds = Histogram(
            "warmer_gateway_sync_seconds",
            "Wall seconds of one gateway sync pass (list, removals, additions until the router shows them).",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=registry,
        )
        self.worker_changes = Counter(
            "warmer_gateway_worker_changes",
            "Workers added to (register) or removed from (deregister) the router, by outcome (ok|failed).",
            ["action", "outcome"],
            registry=registry,
        )
        self.workers = Gauge(
            "warmer_gateway_workers",
            "Workers the router listed at the last pass: ours (fleet boxes) and foreign (left alone).",
            ["owner"],
            registry=registry,
        )
        # Every outcome exists at 0 from the start: an alert on the first failure's increase can fire.
        for outcome in SyncOutcome:
            self.passes.labels(outcome=outcome.value)

    def sync_finished(self, outcome: str, seconds: float) -> None:
        self.passes.labels(outcome=outcome).inc()
        self.pass_seconds.observe(seconds)

    def worker_changed(self, box_id: str, action: str, ok: bool) -> None:
        self.worker_changes.labels(action=action, outcome="ok" if ok else "failed").inc()

    def workers_listed(self, ours: int, foreign: int) -> None:
        self.workers.labels(owner="ours").set(ours)
        self.workers.labels(owner="foreign").set(foreign)


class HitRateMetrics:
    """The hit-rate monitor's `HitRateObserver`: per-box ratio, the alert, and scrape outcomes."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.ratio = Gauge(
            "warmer_box_cache_hit_ratio",
            "Share of prompt tokens served from the prefix cache on each box, over the last judged window "
            "between two scrapes of the engine's own counters.",
            ["box"],
            registry=registry,
        )
        self.below = Gauge(
            "warmer_box_hit_rate_below_threshold",
            "1 while the box's last judged hit ratio is below the configured threshold (the alert).",
            ["box"],
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "warmer_engine_prompt_tokens",
            "Prompt tokens each box's engine reported between scrapes of its own counters, by whether they "
            "came from the prefix cache (cached=true) or were prefilled (cached=false); calls and the "
            "daemon's own warms alike.",
            ["box", "cached"],
            registry=registry,
        )
        self.scrapes = Counter(
            "warmer_cache_scrapes",
            "Scrapes of engine cache counters, by outcome (ok, failed, unsupported).",
            ["outcome"],
            registry=registry,
        )
        for outcome in ("ok", "failed", "unsupported"):  # at 0 from the start, for the alert's increase
            self.scrapes.labels(outcome=outcome)

    def hit_ratio(self, box_id: str, ratio: float) -> None:
        self.ratio.labels(box=box_id).set(ratio)
        # The alert's series exists (at 0) from a box's first judged window, not from its first
        # crossing: a healthy box shows 0, not "no data", on the dashboard and to `absent()`.
        self.below.labels(box=box_id)

    def alert(self, box_id: str, below_threshold: bool) -> None:
        self.below.labels(box=box_id).set(1 if below_threshold else 0)

    def window_tokens(self, box_id: str, queried_tokens: float, hit_tokens: float) -> None:
        hit = min(max(0.0, hit_tokens), max(0.0, queried_tokens))
        self.prompt_tokens.labels(box=box_id, cached="true").inc(hit)
        self.prompt_tokens.labels(box=box_id, cached="false").inc(max(0.0, queried_tokens) - hit)

    def scrape_finished(self, box_id: str, outcome: str) -> None:
        self.scrapes.labels(outcome=outcome).inc()


def _value(figure: float | None) -> float:
    return math.nan if figure is None else figure  # unknown shows as NaN, not as a misleading 0


class CapacityMetrics:
    """The capacity service's `CapacityObserver`: per box and per agent group, the prefill budget in
    uncached prompt tokens per second. Series of boxes and agents that left the fleet are removed."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.box_ceiling = Gauge(
            "warmer_box_prefill_ceiling_tokens_per_second",
            "Uncached prompt tokens/s the box computes at full load (profile figure or measured by the "
            "restart warm-up's long prefill); NaN when unknown.",
            ["box"],
            registry=registry,
        )
        self.box_used = Gauge(
            "warmer_box_uncached_prompt_tokens_per_second",
            "Uncached prompt tokens/s the box computed over its last counter window; NaN when unknown.",
            ["box"],
            registry=registry,
        )
        self.box_headroom = Gauge(
            "warmer_box_prefill_headroom_tokens_per_second",
            "Prefill budget left on the box: ceiling x capacity.safe_fraction minus the uncached tokens/s "
            "used now (negative: over budget, latency breaks); NaN when unknown.",
            ["box"],
            registry=registry,
        )
        self.agent_budget = Gauge(
            "warmer_agent_prefill_budget_tokens_per_second",
            "Sum over the agent's routed, measured boxes of ceiling x capacity.safe_fraction.",
            ["agent"],
            registry=registry,
        )
        self.agent_headroom = Gauge(
            "warmer_agent_prefill_headroom_tokens_per_second",
            "Prefill budget left over the agent's routed boxes (uncached tokens/s), for pacing a campaign; "
            "a box shared by several agents counts for each. NaN when no routed box is measured.",
            ["agent"],
            registry=registry,
        )
        self.agent_calls = Gauge(
            "warmer_agent_prefill_headroom_calls_per_minute",
            "Turn-1 prefills per minute the agent's headroom carries (headroom / uncached tokens of a "
            "turn-1 prompt); an upper bound for new calls. NaN when unknown.",
            ["agent"],
            registry=registry,
        )
        self._boxes: set[str] = set()
        self._agents: set[str] = set()
        self._values: dict[tuple[Gauge, str], float] = {}  # what each series was last set to

    def capacity(self, boxes: Sequence[BoxCapacity], agents: Sequence[AgentCapacity]) -> None:
        for gone in self._boxes - {b.box_id for b in boxes}:
            for gauge in (self.box_ceiling, self.box_used, self.box_headroom):
                gauge.remove(gone)
        for gone in self._agents - {a.agent_id for a in agents}:
            for gauge in (self.agent_budget, self.agent_headroom, self.agent_calls):
                gauge.remove(gone)
        self._boxes = {b.box_id for b in boxes}
        self._agents = {a.agent_id for a in agents}
        # Only what changed is set: a report covers every box and agent (3 series each, thousands of
        # labelled sets at 1,000 agents) once per hit-rate window, on the loop the pre-call asks share.
        values: dict[tuple[Gauge, str], float] = {}
        for box in boxes:
            values[(self.box_ceiling, box.box_id)] = _value(box.ceiling_tokens_per_second)
            values[(self.box_used, box.box_id)] = _value(box.used_tokens_per_second)
            values[(self.box_headroom, box.box_id)] = _value(box.headroom_tokens_per_second)
        for agent in agents:
            values[(self.agent_budget, agent.agent_id)] = _value(agent.budget_tokens_per_second)
            values[(self.agent_headroom, agent.agent_id)] = _value(agent.headroom_tokens_per_second)
            values[(self.agent_calls, agent.agent_id)] = _value(agent.calls_per_minute)
        for (gauge, label), value in values.items():
            last = self._values.get((gauge, label))
            if last is None or (last != value and not (math.isnan(last) and math.isnan(value))):
                gauge.labels(label).set(value)
        self._values = values


class UsageMetrics(Collector):
    """Turn 1 over the window of usage the dialer reports (`POST /v1/usage`), computed at scrape time from
    the same report `GET /v1/usage` answers, so the two never disagree. Agents and boxes are the fleet's
    (the service refuses others), and only those in the window have series; unknown figures are NaN."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._report: Callable[[], CallUsageReport] | None = None
        registry.register(self)

    def attach(self, report: Callable[[], CallUsageReport]) -> None:
        """The usage service's report (the daemon attaches it once built)."""
        self._report = report

    def collect(self) -> Iterator[GaugeMetricFamily]:
        agent_hit = GaugeMetricFamily(
            "warmer_agent_turn1_cache_hit_ratio",
            "Cached share of the prompt tokens of each agent's first turns in the usage window (POST "
            "/v1/usage); about depth x coverage.",
            labels=["agent"],
        )
        depth = GaugeMetricFamily(
            "warmer_agent_prefix_depth_ratio",
            "Reusable share of the agent's turn-1 prompt: warmer's stable prefix, else the deepest turn-1 "
            "hit in the usage window.",
            labels=["agent"],
        )
        coverage = GaugeMetricFamily(
            "warmer_agent_turn1_coverage_ratio",
            "Share of the agent's first turns in the usage window that reached a cache holding its prefix.",
            labels=["agent"],
        )
        box_hit = GaugeMetricFamily(
            "warmer_box_turn1_cache_hit_ratio",
            "Cached share of the prompt tokens of the first turns that ran on each box (usage window).",
            labels=["box"],
        )
        window = GaugeMetricFamily(
            "warmer_usage_window_records", "LLM turns in the usage window (POST /v1/usage)."
        )
        report = self._report() if self._report is not None else None
        if report is not None:
            for split in report.agents:
                if split.agent:
                    agent_hit.add_metric([split.agent], _value(split.turn1_hit_rate))
                    depth.add_metric([split.agent], _value(split.depth))
                    coverage.add_metric([split.agent], _value(split.coverage))
            for box in report.by_box:
                box_hit.add_metric([box.label], _value(box.hit_rate))
        window.add_metric([], 0 if report is None else report.records)
        yield from (agent_hit, depth, coverage, box_hit, window)


class HttpMetrics:
    """The API's `RequestObserver`: every request by route template, method and status class, so
    webhook, pre-call and status outcomes are all visible without a counter per endpoint."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "warmer_http_requests",
            "API requests answered, by route template, method and status class (2xx, 4xx, 5xx...).",
            ["route", "method", "status"],
            registry=registry,
        )
        self.seconds = Histogram(
            "warmer_http_request_seconds",
            "Wall seconds to answer an API request, by route template.",
            ["route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    def request_finished(self, route: str, method: str, status: int, seconds: float) -> None:
        # The labelled children are looked up once per (route, method, status): `labels()` costs more per
        # request than the increment itself at a dialer's rate of pre-call asks.
        key = (route, method, status // 100)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.requests.labels(route=route, method=method, status=f"{status // 100}xx"),
                self.seconds.labels(route=route),
            )
        children[0].inc()
        children[1].observe(seconds)
