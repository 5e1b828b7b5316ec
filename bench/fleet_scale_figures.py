"""The arithmetic of bench.fleet_scale, apart so a unit test checks it: percentiles, log-log slopes, the
deltas of PostgreSQL's per-database counters, a Prometheus counter summed from /metrics text, a quantile of
a Prometheus histogram between two scrapes, the CPU share of a process from /proc, and the time the fleet's
warm budget needs for a restart wave."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
PG_COUNTERS = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted", "tup_fetched")


def percentile(values: Sequence[float], share: float) -> float | None:
    """The nearest-rank percentile (`share` in (0, 1]) of `values`; None when there are none."""
    if not 0 < share <= 1:
        raise ValueError("share must be in (0, 1]")
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def loglog_slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of log(y) against log(x): 1 = the cost grows in proportion to x. None with
    fewer than two distinct x or any value <= 0 (no logarithm)."""
    if len(xs) != len(ys):
        raise ValueError("xs and ys differ in length")
    if len(set(xs)) < 2 or any(v <= 0 for v in (*xs, *ys)):
        return None
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)


def pg_rates(before: Mapping[str, int], after: Mapping[str, int], seconds: float) -> dict[str, float]:
    """Per-second rates of pg_stat_database counters between two reads; `rows_written` is inserted +
    updated + deleted, `transactions` commits + rollbacks."""
    if seconds <= 0:
        raise ValueError("seconds must be > 0")
    delta = {k: after[k] - before[k] for k in PG_COUNTERS}
    if any(v < 0 for v in delta.values()):
        raise ValueError(f"a pg_stat_database counter went down (stats reset?): {delta}")
    rates = {k: delta[k] / seconds for k in PG_COUNTERS}
    rates["transactions"] = (delta["xact_commit"] + delta["xact_rollback"]) / seconds
    rates["rows_written"] = (delta["tup_inserted"] + delta["tup_updated"] + delta["tup_deleted"]) / seconds
    return rates


def metric_sum(text: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """Sum of the samples of `name` (exactly; no suffix) in Prometheus text whose labels include
    `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, label_text = head.partition("{")
        if metric != name:
            continue
        found = dict(part.split("=", 1) for part in label_text.rstrip("}").split(",") if "=" in part)
        found = {k.strip(): v.strip().strip('"') for k, v in found.items()}
        if all(found.get(k) == v for k, v in (labels or {}).items()):
            total += float(value)
    return total


def histogram_buckets(text: str, name: str, labels: Mapping[str, str] | None = None) -> dict[float, float]:
    """The cumulative buckets (upper bound -> count) of histogram `name` in Prometheus text, summed over
    the series whose labels include `labels`."""
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith(f"{name}_bucket{{"):
            continue
        head, _, value = line.rpartition(" ")
        label_text = head.partition("{")[2].rstrip("}")
        found = dict(part.split("=", 1) for part in label_text.split(",") if "=" in part)
        found = {k.strip(): v.strip().strip('"') for k, v in found.items()}
        if "le" not in found or not all(found.get(k) == v for k, v in (labels or {}).items()):
            continue
        bound = math.inf if found["le"] == "+Inf" else float(found["le"])
        buckets[bound] = buckets.get(bound, 0.0) + float(value)
    return buckets


def bucket_quantile(
    before: Mapping[float, float], after: Mapping[float, float], share: float
) -> float | None:
    """The `share` quantile of the observations made between two reads of a histogram's cumulative
    buckets, as the upper bound of the bucket it falls in (an upper estimate: Prometheus buckets keep no
    finer detail); None when nothing was observed between them."""
    if not 0 < share <= 1:
        raise ValueError("share must be in (0, 1]")
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    wanted = share * counts[-1]
    return next(b for b, c in zip(bounds, counts, strict=True) if c >= wanted)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid: int) -> float:
    """Resident set size of a process in MiB, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no VmRSS for pid {pid}")


def warm_budget_seconds(tokens: float, tokens_per_second: float) -> float:
    """The shortest time the fleet warm budget lets `tokens` uncached prompt tokens be warmed in."""
    if tokens_per_second <= 0:
        raise ValueError("tokens_per_second must be > 0")
    return tokens / tokens_per_second
