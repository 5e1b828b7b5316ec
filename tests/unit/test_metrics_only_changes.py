"""A pass reports every box's readiness and every (box, agent) warmth to the metrics; a labelled gauge set
costs microseconds, and at 1,000 agents that was thousands a pass on the event loop the pre-call asks
share. Only the series whose value changed are set; the exposed values stay those of the last report."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from warmer.core.capacity import AgentCapacity, BoxCapacity
from warmer.root.metrics import CapacityMetrics, ReconcileMetrics
from warmer.service.reconciler.types import BoxSeen


def counting_labels(metrics: ReconcileMetrics | CapacityMetrics, name: str) -> list[dict[str, Any]]:
    """Every `.labels(...)` call on the gauge `name` of `metrics`, from now on."""
    gauge = getattr(metrics, name)
    calls: list[dict[str, Any]] = []
    original = gauge.labels

    def labels(*args: Any, **kwargs: Any) -> Any:
        calls.append({"args": args, **kwargs})
        return original(*args, **kwargs)

    gauge.labels = labels
    return calls


def seen(box_id: str, healthy: bool) -> BoxSeen:
    return BoxSeen(box_id, "llamacpp", "m", "", "v1", healthy, None if healthy else "refused")


def test_box_states_set_only_the_series_that_changed() -> None:
    registry = CollectorRegistry()
    metrics = ReconcileMetrics(registry)
    ready = {"b1": True, "b2": False}
    warm = {("b1", f"agent-{i}"): True for i in range(50)} | {("b2", "agent-0"): False}
    metrics.box_states(ready, warm)
    ready_calls = counting_labels(metrics, "box_ready_state")
    warm_calls = counting_labels(metrics, "box_agent_warm")

    metrics.box_states(ready, warm)  # nothing changed
    assert ready_calls == []
    assert warm_calls == []

    metrics.box_states({"b1": True, "b2": True}, {**warm, ("b2", "agent-0"): True})
    assert ready_calls == [{"args": (), "box": "b2"}]
    assert warm_calls == [{"args": (), "box": "b2", "agent": "agent-0"}]
    assert registry.get_sample_value("warmer_box_ready", {"box": "b2"}) == 1
    assert registry.get_sample_value("warmer_box_agent_warm", {"box": "b2", "agent": "agent-0"}) == 1
    assert registry.get_sample_value("warmer_box_agent_warm", {"box": "b1", "agent": "agent-7"}) == 1

    # a series that left and came back is set again (its removal dropped it)
    metrics.box_states({"b1": True}, {("b1", "agent-0"): True})
    assert registry.get_sample_value("warmer_box_ready", {"box": "b2"}) is None
    metrics.box_states(ready, warm)
    assert registry.get_sample_value("warmer_box_ready", {"box": "b2"}) == 0
    assert registry.get_sample_value("warmer_box_agent_warm", {"box": "b1", "agent": "agent-7"}) == 1


def test_boxes_seen_sets_only_the_series_that_changed() -> None:
    registry = CollectorRegistry()
    metrics = ReconcileMetrics(registry)
    metrics.boxes_seen([seen("b1", True), seen("b2", False)])
    healthy_calls = counting_labels(metrics, "box_healthy")
    info_calls = counting_labels(metrics, "box_info")
    failure_calls = counting_labels(metrics, "box_health_failure")

    metrics.boxes_seen([seen("b1", True), seen("b2", False)])
    assert healthy_calls == []
    assert info_calls == []
    assert failure_calls == []

    metrics.boxes_seen([seen("b1", False), seen("b2", False)])
    assert healthy_calls == [{"args": (), "box": "b1"}]
    assert failure_calls == [{"args": (), "box": "b1", "kind": "refused"}]
    assert registry.get_sample_value("warmer_box_healthy", {"box": "b1"}) == 0
    assert registry.get_sample_value("warmer_box_health_failure", {"box": "b1", "kind": "refused"}) == 1

    metrics.boxes_seen([seen("b1", True)])  # b2 left; b1 up again
    assert registry.get_sample_value("warmer_box_healthy", {"box": "b1"}) == 1
    assert registry.get_sample_value("warmer_box_healthy", {"box": "b2"}) is None
    assert registry.get_sample_value("warmer_box_health_failure", {"box": "b1", "kind": "refused"}) is None
    labels = {"box": "b1", "engine": "llamacpp", "model": "m", "group": "", "version": "v1"}
    assert registry.get_sample_value("warmer_box_info", labels) == 1


def test_capacity_gauges_set_only_the_series_that_changed() -> None:
    """The capacity report sets three series per box and per agent once per hit-rate window."""
    registry = CollectorRegistry()
    metrics = CapacityMetrics(registry)

    def box(box_id: str, used: float | None) -> BoxCapacity:
        return BoxCapacity(box_id, 1000.0, None, 600.0, used, None if used is None else 600.0 - used, None)

    def agent(agent_id: str, headroom: float) -> AgentCapacity:
        return AgentCapacity(
            agent_id, ("b1",), ("b1",), 1000.0, 600.0, 100.0, headroom, 10, headroom / 10, ()
        )

    metrics.capacity([box("b1", 100.0), box("b2", None)], [agent("a1", 500.0), agent("a2", 400.0)])
    calls = {
        name: counting_labels(metrics, name)  # type: ignore[arg-type]
        for name in ("box_used", "box_headroom", "agent_headroom", "agent_calls", "box_ceiling")
    }
    metrics.capacity([box("b1", 100.0), box("b2", None)], [agent("a1", 500.0), agent("a2", 400.0)])
    assert all(found == [] for found in calls.values())  # unchanged, NaN (unknown) included

    metrics.capacity([box("b1", 200.0), box("b2", None)], [agent("a1", 500.0), agent("a2", 300.0)])
    assert calls["box_used"] == [{"args": ("b1",)}]
    assert calls["agent_headroom"] == [{"args": ("a2",)}]
    assert calls["box_ceiling"] == []
    assert registry.get_sample_value("warmer_box_uncached_prompt_tokens_per_second", {"box": "b1"}) == 200
    assert (
        registry.get_sample_value("warmer_agent_prefill_headroom_tokens_per_second", {"agent": "a2"}) == 300
    )

    metrics.capacity([box("b1", 200.0)], [agent("a1", 500.0)])  # b2 and a2 left, then came back
    metrics.capacity([box("b1", 200.0), box("b2", 50.0)], [agent("a1", 500.0), agent("a2", 300.0)])
    assert registry.get_sample_value("warmer_box_uncached_prompt_tokens_per_second", {"box": "b2"}) == 50
    assert (
        registry.get_sample_value("warmer_agent_prefill_headroom_tokens_per_second", {"agent": "a2"}) == 300
    )
