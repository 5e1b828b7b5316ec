"""The daemon's Prometheus metrics, on a registry of its own (never the process-global default one).

One registry per app means two daemons in one test process never collide, and /metrics shows exactly
what this daemon registered. Features add their counters and gauges as attributes here.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

import warmer


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
            "warmer_ready", "1 when the daemon is started and its database reachable.", registry=self.registry
        )
        self.root_task_failures = Counter(
            "warmer_root_task_failures",
            "Root tasks that ended on their own (a fatal condition: the daemon then stops).",
            ["task"],
            registry=self.registry,
        )
        self.reconcile = ReconcileMetrics(self.registry)


class ReconcileMetrics:
    """The reconciler's `ReconcileObserver`, on the daemon's own registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.warm_requests = Counter(
            "warmer_warm_requests",
            "Warms and probes finished, by kind (warm|probe), why they were sent, and outcome.",
            ["kind", "reason", "outcome"],
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
        self.boxes_ready = Gauge("warmer_boxes_ready", "Boxes ready for traffic now.", registry=registry)
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

    def warm_finished(self, box_id: str, kind: str, reason: str, outcome: str, seconds: float) -> None:
        self.warm_requests.labels(kind=kind, reason=reason, outcome=outcome).inc()
        self.verify_seconds.labels(kind=kind).observe(seconds)

    def phase_finished(self, box_id: str, phase: str, ok: bool, seconds: float) -> None:
        self.phase_seconds.labels(phase=phase, ok=str(ok).lower()).observe(seconds)

    def box_ready(self, box_id: str, time_to_ready_seconds: float, engine_seconds: float) -> None:
        self.time_to_ready.labels(box=box_id).set(time_to_ready_seconds)
        self.warmup_engine.labels(box=box_id).set(engine_seconds)

    def fleet_state(self, boxes_ready: int, prefixes_warm: int) -> None:
        self.boxes_ready.set(boxes_ready)
        self.prefixes_warm.set(prefixes_warm)
