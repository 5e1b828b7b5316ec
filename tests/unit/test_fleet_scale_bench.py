"""bench.fleet_scale's figure arithmetic: percentiles, log-log slopes, pg_stat_database deltas, Prometheus
counter sums, the warm budget floor, and the slopes over runs."""

from __future__ import annotations

import math
import os

import pytest

from bench.fleet_scale import slopes
from bench.fleet_scale_figures import (
    bucket_quantile,
    cpu_seconds,
    histogram_buckets,
    loglog_slope,
    metric_sum,
    percentile,
    pg_rates,
    rss_mib,
    warm_budget_seconds,
)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([3.0, 1.0, 2.0], 0.99) == 3.0
    assert percentile([], 0.5) is None
    with pytest.raises(ValueError, match="share"):
        percentile(values, 0.0)


def test_loglog_slope_recovers_the_power() -> None:
    xs = [500.0, 1000.0, 5000.0]
    assert loglog_slope(xs, [3 * x for x in xs]) == pytest.approx(1.0)
    assert loglog_slope(xs, [x**2 / 7 for x in xs]) == pytest.approx(2.0)
    assert loglog_slope(xs, [4.0, 4.0, 4.0]) == pytest.approx(0.0)
    assert loglog_slope([500.0, 500.0], [1.0, 2.0]) is None  # one size: no slope
    assert loglog_slope([500.0, 1000.0], [0.0, 2.0]) is None  # no logarithm of 0
    with pytest.raises(ValueError, match="length"):
        loglog_slope([1.0, 2.0], [1.0])


def counters(**values: int) -> dict[str, int]:
    base = dict.fromkeys(
        ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted", "tup_fetched"), 0
    )
    return {**base, **values}


def test_pg_rates_are_deltas_per_second() -> None:
    before = counters(xact_commit=100, xact_rollback=2, tup_inserted=10, tup_updated=20, tup_fetched=5)
    after = counters(xact_commit=700, xact_rollback=8, tup_inserted=70, tup_updated=320, tup_deleted=30,
                     tup_fetched=1205)  # fmt: skip
    rates = pg_rates(before, after, 60.0)
    assert rates["transactions"] == pytest.approx((600 + 6) / 60)
    assert rates["rows_written"] == pytest.approx((60 + 300 + 30) / 60)
    assert rates["tup_fetched"] == pytest.approx(1200 / 60)
    with pytest.raises(ValueError, match="went down"):
        pg_rates(after, before, 60.0)
    with pytest.raises(ValueError, match="seconds"):
        pg_rates(before, after, 0.0)


METRICS = """\
# HELP warmer_engine_control_requests_total Control requests
# TYPE warmer_engine_control_requests_total counter
warmer_engine_control_requests_total{kind="health"} 120.0
warmer_engine_control_requests_total{kind="epoch"} 30.0
warmer_engine_control_requests_total_extra{kind="health"} 999.0
warmer_fleet_warm_budget_tokens_per_second 8000.0
"""


def test_metric_sum_matches_the_exact_name_and_labels() -> None:
    assert metric_sum(METRICS, "warmer_engine_control_requests_total") == 150.0
    assert metric_sum(METRICS, "warmer_engine_control_requests_total", {"kind": "epoch"}) == 30.0
    assert metric_sum(METRICS, "warmer_fleet_warm_budget_tokens_per_second") == 8000.0
    assert metric_sum(METRICS, "warmer_missing") == 0.0


def histogram(full: tuple[int, ...], health: tuple[int, ...]) -> str:
    """Prometheus text of warmer_reconcile_pass_seconds with cumulative counts at le 0.1, 1, +Inf."""
    lines = []
    for kind, counts in (("full", full), ("health", health)):
        for bound, count in zip(("0.1", "1.0", "+Inf"), counts, strict=True):
            lines.append(f'warmer_reconcile_pass_seconds_bucket{{kind="{kind}",le="{bound}"}} {count}.0')
        lines.append(f'warmer_reconcile_pass_seconds_count{{kind="{kind}"}} {counts[-1]}.0')
    return "\n".join(lines) + "\n"


def test_histogram_quantile_between_two_scrapes() -> None:
    name = "warmer_reconcile_pass_seconds"
    before = histogram_buckets(histogram((5, 5, 5), (1, 1, 1)), name, {"kind": "full"})
    assert before == {0.1: 5.0, 1.0: 5.0, math.inf: 5.0}
    # between the scrapes: 90 passes under 0.1 s, 9 between 0.1 and 1 s, one over 1 s
    after = histogram_buckets(histogram((95, 104, 105), (1, 1, 1)), name, {"kind": "full"})
    assert bucket_quantile(before, after, 0.5) == 0.1
    assert bucket_quantile(before, after, 0.9) == 0.1
    assert bucket_quantile(before, after, 0.99) == 1.0
    assert bucket_quantile(before, after, 1.0) == math.inf
    both = histogram_buckets(histogram((95, 104, 105), (1, 1, 1)), name)  # the kinds summed
    assert both[math.inf] == 106.0
    assert bucket_quantile(after, after, 0.5) is None  # nothing observed in between
    with pytest.raises(ValueError, match="share"):
        bucket_quantile(before, after, 0.0)


def test_proc_readings_of_this_process() -> None:
    assert cpu_seconds(os.getpid()) > 0
    assert 1 < rss_mib(os.getpid()) < 100_000


def test_warm_budget_floor() -> None:
    assert warm_budget_seconds(80_000, 8000) == 10.0
    with pytest.raises(ValueError, match="tokens_per_second"):
        warm_budget_seconds(1, 0)


def run(boxes: int, cpu: list[float], transactions: float, p99: float | None) -> dict[str, object]:
    steady = {
        "replica_cpu_percent": cpu,
        "replica_rss_mib": [100.0, 110.0, 120.0],
        "control_per_box_per_minute_sim": 12.0,
        "db_transactions_per_second": transactions,
        "db_rows_written_per_second": transactions / 2,
    }
    restart = {"routes_gone_everywhere_seconds": {"p99": p99}}
    return {"boxes": boxes, "steady": steady, "ready_seconds": 30.0, "restart": restart}


def test_slopes_over_runs() -> None:
    got = slopes([run(500, [10.0, 10.0, 10.0], 50.0, 4.0), run(1000, [20.0, 20.0, 20.0], 200.0, None)])
    assert got["replica_cpu_percent_sum"] == pytest.approx(1.0)
    assert got["db_transactions_per_second"] == pytest.approx(2.0)
    assert got["control_requests_per_minute"] == pytest.approx(1.0)  # per box constant: total linear
    assert got["ready_seconds"] == pytest.approx(0.0)
    assert got["routes_gone_p99_seconds"] is None  # not measured at one size
