"""Several fleet-bench runs, one figure: the rotation, the small per-run summary, and their median and range.

One run of `python -m bench.fleet` is a single sample on a shared 2-core machine; the documented figures
are `--runs 3`: the whole policy set three times on fresh boxes, the order rotated each run (run k starts
at policy k mod n) so no arm always goes first on a cold machine or last on a hot one. After each run and
setting the bench writes a summary of a few KB (`fleet-summary-<shape>-<setting>-<UTC>.json`: the
per-policy figures and the run's metadata, committed beside the figures it backs; the per-turn JSON
stays uncommitted), and

    python -m bench.fleet_runs bench/results/fleet-summary-crowded-tight-*.json

prints the median and the min-max range of every figure per policy over those summaries (they must share
shape, setting and model).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.fleet_figures import ROWS, PolicyFigures, fmt_value

# beside the per-run table's figures: how much got served, and how long each arm's pre-traffic warm took
MORE_ROWS: tuple[tuple[str, str, str], ...] = (
    ("calls served", "calls_served", "count"),
    ("failed attempts", "failures", "count"),
    ("turns ≥ 2 served", "later_turns", "count"),
    ("pre-traffic warm time (s)", "pre_traffic_warm_s", "count"),
)
SUMMARY_ROWS = ROWS + MORE_ROWS
SUMMARY_KIND = "fleet-summary"
SUMMARY_VERSION = 1
REPO = Path(__file__).resolve().parent.parent


def rotated(policies: Sequence[str], run: int) -> list[str]:
    """The policy order of run `run` (0-based): it starts at policy `run mod n`, the rest in order."""
    if not policies:
        return []
    start = run % len(policies)
    return [*policies[start:], *policies[:start]]


def git_commit(repo: Path = REPO) -> dict[str, Any]:
    """The commit the bench ran at, and whether bench/ or warmer/ had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--", "bench", "warmer"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}
    return {"commit": head, "dirty": bool(dirty)}


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "load_at_start": list(os.getloadavg())}


def summary_json(
    meta: Mapping[str, Any],
    run: Mapping[str, Any],
    calibration: Mapping[str, Any],
    figures: Sequence[PolicyFigures],
) -> dict[str, Any]:
    """What one run of one setting leaves behind for the record: `meta` (shape, model, schedule, ...),
    `run` (setting, index, policy order, commit, machine load), the limit, and each policy's figures."""
    return {
        "kind": SUMMARY_KIND,
        "version": SUMMARY_VERSION,
        "meta": dict(meta),
        "run": dict(run),
        "calibration": dict(calibration),
        "figures": [f.as_json() for f in figures],
    }


def write_summary(results_dir: Path, summary: Mapping[str, Any]) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    name = f"fleet-summary-{summary['meta']['shape']}-{summary['run']['setting']}-{stamp}"
    path = results_dir / f"{name}.json"
    suffix = 1
    while path.exists():  # two summaries in one second (tiny runs): keep both
        path = results_dir / f"{name}-{suffix}.json"
        suffix += 1
    path.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return path


def load_summaries(paths: Sequence[Path]) -> list[dict[str, Any]]:
    summaries = []
    for path in paths:
        data = json.loads(path.read_text())
        if data.get("kind") != SUMMARY_KIND:
            raise ValueError(f"{path}: not a fleet summary (kind {data.get('kind')!r})")
        summaries.append(data)
    return summaries


def _key(summary: Mapping[str, Any]) -> tuple[str, str, str]:
    return (summary["meta"]["shape"], summary["run"]["setting"], summary["meta"]["model"])


def _figure(figures: Mapping[str, Any], attr: str) -> Any:
    if attr == "pre_traffic_warm_s":
        return ((figures.get("extra") or {}).get("pre_traffic") or {}).get("warm_seconds")
    return figures.get(attr)


def spread(values: Sequence[float]) -> tuple[float, float, float] | None:
    """(median, min, max), None for no values."""
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def aggregate(
    summaries: Sequence[Mapping[str, Any]],
) -> dict[str, dict[str, tuple[float, float, float] | None]]:
    """Per policy (in first-seen order), per figure: median and range over the runs that have it. Refuses
    summaries of different shape, setting or model: their figures are not samples of one thing."""
    if not summaries:
        raise ValueError("no summaries given")
    keys = {_key(s) for s in summaries}
    if len(keys) > 1:
        raise ValueError(f"summaries of different shape/setting/model: {sorted(keys)}")
    values: dict[str, dict[str, list[float]]] = {}
    for summary in summaries:
        for figures in summary["figures"]:
            per_figure = values.setdefault(figures["policy"], {})
            for _, attr, _ in SUMMARY_ROWS:
                value = _figure(figures, attr)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    per_figure.setdefault(attr, []).append(float(value))
    return {
        policy: {attr: spread(per_figure.get(attr, [])) for _, attr, _ in SUMMARY_ROWS}
        for policy, per_figure in values.items()
    }


def _cell(value: tuple[float, float, float] | None, kind: str) -> str:
    if value is None:
        return "–"

    def shown(number: float) -> str:
        return f"{number:.3g}" if kind == "count" else fmt_value(number, kind)

    median, low, high = value
    if low == high:
        return shown(median)
    return f"{shown(median)} ({shown(low)}–{shown(high)})"


def summary_table(summaries: Sequence[Mapping[str, Any]]) -> str:
    """A heading naming what was aggregated, then a Markdown table: median (min–max) per figure."""
    table = aggregate(summaries)
    shape, setting, model = _key(summaries[0])
    commits = sorted({str((s["run"].get("git") or {}).get("commit") or "?")[:7] for s in summaries})
    loads = [s["run"].get("machine", {}).get("load_at_start", [None])[0] for s in summaries]
    shown_loads = ", ".join("?" if x is None else f"{x:.1f}" for x in loads)
    heading = (
        f"### {shape} shape, {setting}, {model} model: median (min–max) over {len(summaries)} run(s); "
        f"code at {', '.join(commits)}; 1-min load at each run's start {shown_loads}"
    )
    policies = list(table)
    lines = [heading, "", "| figure | " + " | ".join(policies) + " |", "|---|" + "---|" * len(policies)]
    for label, attr, kind in SUMMARY_ROWS:
        cells = [_cell(table[p][attr], kind) for p in policies]
        if all(c == "–" for c in cells):
            continue
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_runs", description=__doc__.splitlines()[0])
    parser.add_argument("summaries", nargs="+", type=Path, help="fleet-summary-*.json of one shape/setting")
    args = parser.parse_args(argv)
    try:
        print(summary_table(load_summaries(args.summaries)))
    except (ValueError, KeyError, OSError) as exc:
        print(f"fleet_runs: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
