"""`warmer hitrate --calls FILE --chart out.png`: hit rate by turn index and the turn-1 cached-token
histogram as one PNG, drawn with matplotlib (the optional `charts` extra, imported only when asked)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from warmer.cli.exits import Unavailable
from warmer.core.call_report import CallUsageReport

EXTRA_HINT = "pip install 'warmer[charts]'"


def write_chart(path: Path, report: CallUsageReport, turn1_cached: Sequence[int]) -> None:
    """Two panels: hit rate per turn index (bars, turn-1 rate per group as lines), and the histogram of
    cached tokens per turn-1 request with each agent's dominant value marked."""
    try:
        # The object API (Figure + the Agg canvas), not pyplot: no global figure state and no GUI backend.
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise Unavailable(f"--chart needs matplotlib, the `charts` extra: {EXTRA_HINT}") from exc
    figure = Figure(figsize=(11, 4.2), layout="constrained")
    FigureCanvasAgg(figure)
    by_turn, histogram = figure.subplots(1, 2)
    labels = [row.label for row in report.by_turn]
    rates = [100 * (row.hit_rate or 0.0) for row in report.by_turn]
    by_turn.bar(labels, rates, color="#4c72b0", label="all requests")
    for index, group in enumerate(report.by_group, start=1):
        if group.turn1.hit_rate is not None:
            name = group.group or "(none)"
            by_turn.axhline(
                100 * group.turn1.hit_rate,
                color=f"C{index}",  # the next colours of matplotlib's cycle: one per group
                linestyle="--",
                linewidth=1.5,
                label=f"turn 1, {name}",
            )
    by_turn.set(title="Hit rate by turn index", xlabel="turn", ylabel="cached / prompt tokens (%)")
    by_turn.set_ylim(0, 100)
    by_turn.legend(fontsize="small")
    histogram.hist(list(turn1_cached), bins=40, color="#55a868")
    for spike in report.distribution.spikes:
        color = "#c44e52" if spike.suspicious else "#8172b2"
        histogram.axvline(spike.cached_tokens, color=color, linestyle=":", linewidth=1.5)
        name = spike.agent or "(none)"
        histogram.annotate(
            f"{spike.cached_tokens:,} ({name})",
            (spike.cached_tokens, 0.95),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize="small",
            color=color,
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
        )
    histogram.set(title="Cached tokens per turn-1 request", xlabel="cached tokens", ylabel="requests")
    try:
        figure.savefig(path, format="png", dpi=100)
    except OSError as exc:
        raise Unavailable(f"{path}: {exc.strerror or exc}") from exc
