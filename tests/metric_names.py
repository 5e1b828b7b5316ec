"""The metric sample names warmer really exports, read from the daemon's own registry: dashboards and
alerts are checked against this, so a renamed metric fails a test instead of a silent panel."""

from __future__ import annotations

import re

from warmer.root.metrics import Metrics

_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("_count", "_sum", ""),
    "info": ("_info",),
}
# Metric names in PromQL: identifiers not followed by `(` (functions) nor inside `{...}` label matchers.
_WARMER_NAME = re.compile(r"\bwarmer_[a-z0-9_]+\b")


def exported_sample_names() -> set[str]:
    """Every sample name /metrics can carry (labelled families count even before their first child)."""
    names: set[str] = set()
    for family in Metrics().registry.collect():
        names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return names


def warmer_metrics_in(expression: str) -> set[str]:
    """The `warmer_*` metric names a PromQL expression reads."""
    return set(_WARMER_NAME.findall(expression))
