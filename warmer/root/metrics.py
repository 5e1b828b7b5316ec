"""The daemon's Prometheus metrics, on a registry of its own (never the process-global default one).

One registry per app means two daemons in one test process never collide, and /metrics shows exactly
what this daemon registered. Features add their counters and gauges as attributes here.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Info
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
