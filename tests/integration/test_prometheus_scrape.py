"""A real Prometheus (Debian's `prometheus` package, installed by scripts/ensure-services) scrapes a real
`warmer serve` over two real llama-server boxes, loads deploy/prometheus/warmer.rules.yml, and every query
of the Grafana dashboard returns data from what it scraped; with a box killed, the health panel shows how
it fails. Bounded waits only (no timing assertions)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from testbed.fleet import free_loopback_port
from tests.integration.daemon_harness import (
    AGENT,
    AGENTS_DIR,
    FleetFactory,
    Serve,
    fleet_boxes,
    running_serve,
    turn1,
    write_config,
)
from warmer.config.agents import load_agent_specs

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "warmer.json"
RULES = REPO / "deploy" / "prometheus" / "warmer.rules.yml"
NAMESPACE, JOB = "warmer-test", "warmer"
WAIT = 240.0  # seconds; a loaded 2-core machine: a bound, not an expectation
# Hit rates judged every 2 s on any traffic, so the per-box hit-rate panel has data within the test.
SECTIONS = """
[hitrate]
poll_seconds = 2.0
min_tokens_per_window = 1
"""


@contextmanager
def prometheus(tmp_path: Path, target: str) -> Iterator[Serve]:
    """`prometheus` on loopback scraping `target` every second as job `warmer` in NAMESPACE, with the
    shipped rules loaded, as a process the harness waits on like `warmer serve`."""
    binary = shutil.which("prometheus")
    assert binary is not None, "prometheus is missing: run scripts/ensure-services (make check-services)"
    port = free_loopback_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {
                        "job_name": JOB,
                        "static_configs": [{"targets": [target], "labels": {"namespace": NAMESPACE}}],
                    }
                ],
            }
        )
    )
    log_path = tmp_path / "prometheus.log"
    log = log_path.open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server = Serve(process, f"http://127.0.0.1:{port}", log_path)
    try:
        server.wait("prometheus ready", lambda: httpx.get(f"{server.base_url}/-/ready", timeout=5).is_success)
        yield server
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def _query(base: str, expr: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{base}/api/v1/query", params={"query": expr}, timeout=10)
    response.raise_for_status()
    result: list[dict[str, Any]] = response.json()["data"]["result"]
    return result


def _dashboard_queries() -> dict[str, str]:
    """Every panel target's expression, with the dashboard variables as a viewer would pick them."""
    queries = {}
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$namespace", NAMESPACE).replace("$job", JOB)
            queries[f"{panel['title']} [{target['refId']}]"] = expr.replace("$__rate_interval", "5m")
    return queries


def test_a_real_prometheus_scrapes_warmer_and_every_dashboard_query_returns_data(
    llama_fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    fleet = llama_fleet_factory(2, slots=2, ctx_per_slot=4096)
    port = free_loopback_port()
    config = write_config(tmp_path, fleet_boxes(fleet), port, sections=SECTIONS)
    agent = load_agent_specs(AGENTS_DIR)[AGENT]
    with running_serve(config, port, tmp_path / "serve.log") as serve:
        box_ids = [box.id for box in fleet.boxes]
        serve.wait("both boxes ready", lambda: all(serve.is_ready(box_id) for box_id in box_ids))
        for box in fleet.boxes:  # calls, so the engines' counters move and hit rates are judged
            timings = turn1(box.base_url, agent)["timings"]
            cached, new = int(timings["cache_n"]), int(timings["prompt_n"])
            usage = {"prompt_tokens": cached + new, "prompt_tokens_details": {"cached_tokens": cached}}
            record = {"call_id": f"call-{box.id}", "turn": 1, "agent": AGENT, "box": box.id, "usage": usage}
            # the dialer's report of that turn (POST /v1/usage), for the turn-1 panel
            httpx.post(f"{serve.base_url}/v1/usage", json=record, timeout=10).raise_for_status()
        httpx.post(f"{serve.base_url}/v1/prewarm", json={"agent": AGENT}, timeout=10).raise_for_status()
        with prometheus(tmp_path, f"127.0.0.1:{port}") as server:
            base = server.base_url
            queries = _dashboard_queries()
            health = {name: expr for name, expr in queries.items() if "warmer_box_health_failure" in expr}
            assert health, "the dashboard has a health-failure panel"
            empty: dict[str, str] = {}

            def all_have_data() -> bool:
                empty.clear()
                empty.update({n: e for n, e in queries.items() if n not in health and not _query(base, e)})
                return not empty

            try:
                server.wait("data for every dashboard query", all_have_data, WAIT)
            except AssertionError as exc:
                raise AssertionError(f"still without data: {sorted(empty)}") from exc

            rules = httpx.get(f"{base}/api/v1/rules", timeout=10).json()["data"]["groups"]
            (group,) = [g for g in rules if g["name"] == "warmer"]
            assert {rule["health"] for rule in group["rules"]} == {"ok"}, "every rule evaluates"
            alerts = httpx.get(f"{base}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
            assert "WarmerAbsent" not in {a["labels"]["alertname"] for a in alerts}, "warmer is up"

            fleet.kill(box_ids[0])  # the engine process dies: refused
            (expr,) = health.values()

            def refused_shown() -> bool:
                return any(r["metric"] == {"box": box_ids[0], "kind": "refused"} for r in _query(base, expr))

            server.wait("the health panel to show the killed box as refused", refused_shown, WAIT)
        serve.stop()
