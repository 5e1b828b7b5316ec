"""Builds the generated files of deploy/, so none of them is hand-edited or kept in two copies:

- grafana/warmer.json: the Grafana dashboard, with Grafana's own Foundation SDK (typed builders of the
  dashboard schema);
- kubernetes/components/monitoring/grafana-dashboard.yaml: the same JSON in a ConfigMap labelled for
  Grafana's dashboard sidecar;
- kubernetes/components/monitoring/prometheusrule.yaml: prometheus/warmer.rules.yml (the one rule file,
  also loadable by a plain Prometheus) as the Prometheus Operator's PrometheusRule.

    python deploy/build.py          # rewrites all three

tests/unit/test_grafana_dashboard.py and test_deploy_files.py check the committed files are this builder's
output and that every query reads metrics warmer really exports.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from grafana_foundation_sdk.builders.dashboard import Dashboard, DatasourceVariable, QueryVariable, Row
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as Stat
from grafana_foundation_sdk.builders.statetimeline import Panel as StateTimeline
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort

DEPLOY = Path(__file__).resolve().parent
OUTPUT = DEPLOY / "grafana" / "warmer.json"
MONITORING = DEPLOY / "kubernetes" / "components" / "monitoring"
DASHBOARD_CONFIGMAP = MONITORING / "grafana-dashboard.yaml"
RULES = DEPLOY / "prometheus" / "warmer.rules.yml"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
UID = "warmer"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
# Every series a panel reads is narrowed to the chosen warmer: the namespace it runs in and the scrape job.
SCOPE = 'namespace=~"$namespace", job=~"$job"'
_METRIC = re.compile(r"\b(warmer_[a-z0-9_]+)(\{([^}]*)\})?")
# kube-prometheus-stack selects ServiceMonitors and PrometheusRules by this label (its Helm release name);
# the example overlay shows how to set another value.
RELEASE_LABEL = {"release": "kube-prometheus-stack"}
# Grafana's dashboard sidecar (kube-prometheus-stack: grafana.sidecar.dashboards.label / labelValue)
# loads every ConfigMap carrying this label.
SIDECAR_LABEL = {"grafana_dashboard": "1"}
NAME_LABEL = {"app.kubernetes.io/name": "warmer"}


def scoped(expr: str) -> str:
    """`expr` with every warmer_* selector narrowed to the dashboard's namespace and job."""

    def narrow(match: re.Match[str]) -> str:
        matchers = match.group(3)
        return f"{match.group(1)}{{{matchers + ', ' if matchers else ''}{SCOPE}}}"

    return _METRIC.sub(narrow, expr)


def _label_variable(name: str, label: str, query: str) -> QueryVariable:
    return (
        QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query({"query": query, "refId": name})
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .include_all(True)
        .all_value(".*")
        .multi(False)
    )


def _p95(bucket: str, by: str) -> str:
    return f"histogram_quantile(0.95, sum by ({by}, le) (rate({bucket}[{RATE}])))"


def _query(expr: str, legend: str) -> Dataquery:
    return Dataquery().expr(scoped(expr)).legend_format(legend)


def _series(title: str, description: str, unit: str, *queries: Dataquery, width: int = 12) -> Timeseries:
    panel = Timeseries().title(title).description(description).unit(unit).datasource(DATASOURCE)
    panel = panel.span(width).height(8)
    for index, query in enumerate(queries):
        panel = panel.with_target(query.ref_id(chr(ord("A") + index)))
    return panel


def _stat(title: str, description: str, expr: str) -> Stat:
    panel = Stat().title(title).description(description).datasource(DATASOURCE).span(6).height(4)
    return panel.with_target(_query(expr, title).ref_id("A"))


def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    builder = (
        Dashboard("warmer")
        .uid(UID)
        .description("Prefix warmth, readiness and hit rate per box and agent; warmer's own API and load.")
        .tags(["warmer", "llm", "kv-cache"])
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .with_variable(DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(_label_variable("namespace", "Namespace", "label_values(warmer_up, namespace)"))
        .with_variable(_label_variable("job", "Job", 'label_values(warmer_up{namespace=~"$namespace"}, job)'))
        .with_row(Row("Fleet"))
        .with_panel(_stat("Boxes ready", "Boxes traffic may use now.", "max(warmer_boxes_ready)"))
        .with_panel(_stat("Prefixes warm", "(box, prefix) pairs verified warm.", "max(warmer_prefixes_warm)"))
        .with_panel(
            _stat("Daemon ready", "1 when every replica is ready (database reachable).", "min(warmer_ready)")
        )
        .with_panel(
            _stat(
                "Root task failures (1h)",
                "Root tasks that ended on their own: each one stopped a daemon.",
                "sum(increase(warmer_root_task_failures_total[1h]))",
            )
        )
        .with_row(Row("Boxes"))
        .with_panel(
            StateTimeline()
            .title("Ready per box")
            .description("1 = ready for traffic (restart warm-up done, its agents' prefixes warm).")
            .datasource(DATASOURCE)
            .span(12)
            .height(8)
            .with_target(_query("max by (box) (warmer_box_ready)", "{{box}}").ref_id("A"))
        )
        .with_panel(
            _series(
                "Health failures per box",
                "1 while the box's health poll fails, by how: refused (process down), connect_timeout "
                "(host or network policy), http_status (e.g. 503 while loading), timeout (busy), epoch.",
                "short",
                _query("max by (box, kind) (warmer_box_health_failure)", "{{box}} {{kind}}"),
            )
        )
        .with_panel(
            _series(
                "Prefixes warming per box",
                "Agent prefixes a box should hold that are not warm yet in its current epoch.",
                "short",
                _query("sum by (box) (1 - max by (box, agent) (warmer_box_agent_warm))", "{{box}}"),
            )
        )
        .with_panel(
            _series(
                "Cache hit rate per box",
                "Share of prompt tokens the engine served from its prefix cache between two scrapes; "
                "the alert fires below hitrate.threshold.",
                "percentunit",
                _query("max by (box) (warmer_box_cache_hit_ratio)", "{{box}}"),
                _query("max by (box) (warmer_box_hit_rate_below_threshold)", "{{box}} below threshold"),
            )
        )
        .with_panel(
            _series(
                "Time to ready per box",
                "Last epoch: health up to ready (wall), and the engine's own share of it.",
                "s",
                _query("max by (box) (warmer_time_to_ready_seconds)", "{{box}} time to ready"),
                _query("max by (box) (warmer_warmup_engine_seconds)", "{{box}} engine"),
            )
        )
        .with_row(Row("Agents"))
        .with_panel(
            _series(
                "Routed boxes per agent",
                "Boxes where the agent's current prefix is warm in the box's current epoch: its routes.",
                "short",
                _query("sum by (agent) (max by (agent, box) (warmer_box_agent_warm))", "{{agent}}"),
            )
        )
        .with_panel(
            _series(
                "Turn-1 hit rate per agent (reported usage)",
                "From the usage the dialer reports per turn (POST /v1/usage): cached share of first turns, "
                "and its two causes: depth (reusable share of the prompt) and coverage (share of first "
                "turns that reached a warm cache). Turn-1 hit rate is about depth x coverage.",
                "percentunit",
                _query("max by (agent) (warmer_agent_turn1_cache_hit_ratio)", "{{agent}} turn 1"),
                _query("max by (agent) (warmer_agent_prefix_depth_ratio)", "{{agent}} depth"),
                _query("max by (agent) (warmer_agent_turn1_coverage_ratio)", "{{agent}} coverage"),
            )
        )
        .with_panel(
            _series(
                "Warm traffic vs call prefill",
                "Prompt tokens per second: warmer's own warms and probes against what the engines "
                "prefilled (cache misses) and served from cache (both include warmer's requests).",
                "short",
                _query(f"sum(rate(warmer_warm_prompt_tokens_total[{RATE}]))", "warmer warms"),
                _query(
                    f'sum(max by (box) (rate(warmer_engine_prompt_tokens_total{{cached="false"}}[{RATE}])))',
                    "prefilled",
                ),
                _query(
                    f'sum(max by (box) (rate(warmer_engine_prompt_tokens_total{{cached="true"}}[{RATE}])))',
                    "from cache",
                ),
            )
        )
        .with_panel(
            _series(
                "Warms and probes by outcome",
                "Warm and probe requests finished per second.",
                "reqps",
                _query(
                    f"sum by (kind, outcome) (rate(warmer_warm_requests_total[{RATE}]))",
                    "{{kind}} {{outcome}}",
                ),
            )
        )
        .with_panel(
            _series(
                "Warm verify latency (p95)",
                "Wall seconds of one warm-and-verify or probe, engine round trips included.",
                "s",
                _query(
                    _p95("warmer_warm_verify_seconds_bucket", "kind"),
                    "{{kind}}",
                ),
            )
        )
        .with_row(Row("API"))
        .with_panel(
            _series(
                "API requests by route and status",
                "Requests answered per second, by route template and status class.",
                "reqps",
                _query(
                    f"sum by (route, status) (rate(warmer_http_requests_total[{RATE}]))",
                    "{{route}} {{status}}",
                ),
            )
        )
        .with_panel(
            _series(
                "API latency by route (p95)",
                "Seconds to answer, by route template.",
                "s",
                _query(
                    _p95("warmer_http_request_seconds_bucket", "route"),
                    "{{route}}",
                ),
            )
        )
    )
    encoded: dict[str, Any] = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    return encoded


def render() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings as `|` blocks, so the generated manifests stay readable and diffable."""


def _block_strings(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _block_strings)


def _manifest(header: str, document: dict[str, Any]) -> str:
    body = yaml.dump(document, Dumper=_BlockDumper, sort_keys=False, width=120)
    return f"# {header} Generated by deploy/build.py: edit that, not this.\n{body}"


def render_dashboard_configmap() -> str:
    document = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "warmer-dashboard", "labels": {**NAME_LABEL, **SIDECAR_LABEL}},
        "data": {"warmer.json": render()},
    }
    return _manifest("deploy/grafana/warmer.json for Grafana's dashboard sidecar.", document)


def render_prometheus_rule() -> str:
    document = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "warmer", "labels": {**NAME_LABEL, **RELEASE_LABEL}},
        "spec": yaml.safe_load(RULES.read_text()),
    }
    return _manifest("deploy/prometheus/warmer.rules.yml for the Prometheus Operator.", document)


def outputs() -> dict[Path, str]:
    """Every generated file and the text it must hold."""
    return {
        OUTPUT: render(),
        DASHBOARD_CONFIGMAP: render_dashboard_configmap(),
        PROMETHEUS_RULE: render_prometheus_rule(),
    }


if __name__ == "__main__":
    for path, text in outputs().items():
        path.write_text(text)
        sys.stdout.write(f"wrote {path}\n")
