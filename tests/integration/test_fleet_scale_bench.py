"""bench.fleet_scale end to end at a tiny size (10 sim boxes, 2 real replicas on a fresh PostgreSQL
database): every box becomes ready on both replicas, each replica reports its pass durations, a restarted
box leaves readiness and comes back on both, and every figure the bench reports exists and is consistent
with the others. No timing is asserted: speed is the bench's (BENCHMARKS.md)."""

from __future__ import annotations

import argparse

import pytest

from bench.fleet_scale import run_one

pytestmark = pytest.mark.integration


def test_a_tiny_run_reports_every_figure() -> None:
    args = argparse.Namespace(
        replicas=2, agents=2, steady=6.0, restart=0.2, ready_timeout=120.0, restart_timeout=90.0,
        sim_processes=1, min_ready_share=1.0,
    )  # fmt: skip
    result = run_one(10, args)
    assert result["ready_seconds"] is not None  # every box ready on both replicas
    steady = result["steady"]
    assert len(steady["replica_cpu_percent"]) == len(steady["replica_rss_mib"]) == 2
    assert all(cpu >= 0 for cpu in steady["replica_cpu_percent"])
    assert all(rss > 10 for rss in steady["replica_rss_mib"])
    # the lease holders poll the boxes: the sim counts the control requests, so does warmer
    assert steady["control_per_box_per_minute_sim"] > 0
    assert steady["control_per_box_per_minute_warmer"] > 0
    assert steady["health_epoch_per_box_per_interval"] > 0
    assert steady["db_transactions_per_second"] > 0  # heartbeats and observations reach the database
    # both kinds of pass ran on each replica during the window, and each p99 is at least its p50
    for kind in ("full", "health"):
        quantiles = steady["pass_seconds"][kind]
        assert len(quantiles["p50"]) == len(quantiles["p99"]) == 2
        for p50, p99 in zip(quantiles["p50"], quantiles["p99"], strict=True):
            assert p50 is not None
            assert p99 is not None
            assert 0 < p50 <= p99
    restart = result["restart"]
    assert restart["restarted"] == 2
    assert restart["restarted_routed"] >= 1  # routed boxes go first in the wave
    # whether the replicas' route tables agreed (read one after the other: a race, so reported, not asserted)
    assert len(restart["routed_boxes_before_per_replica"]) == 2
    assert min(restart["routed_boxes_before_per_replica"]) >= 1
    assert isinstance(restart["routes_agree_before"], bool)
    assert isinstance(restart["routes_agree_after"], bool)
    gone, back = restart["routes_gone_everywhere_seconds"], restart["restarted_ready_everywhere_seconds"]
    assert gone["missed"] == 0
    assert back["missed"] == 0
    assert 0 <= gone["p50"] <= gone["p99"] <= gone["max"] <= back["max"]
    assert restart["every_agent_routed_again_seconds"] is not None
    assert restart["fleet_warm_budget_tokens_per_second"] > 0
    assert restart["tokens_held_by_restarted"] > 0
    assert restart["budget_floor_seconds_held"] >= 0
