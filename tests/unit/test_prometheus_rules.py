"""deploy/prometheus/warmer.rules.yml under the real Prometheus rule engine: `promtool check rules` accepts
it and `promtool test rules` (tests/prometheus/warmer.rules.test.yml) makes every alert fire on series
shaped like warmer's and clear again. promtool comes from Debian's prometheus package, which
scripts/ensure-services installs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "warmer.rules.yml"
RULE_TESTS = REPO / "tests" / "prometheus" / "warmer.rules.test.yml"


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is missing: run scripts/ensure-services (make check-services)"
    return subprocess.run(
        [promtool, *args], capture_output=True, text=True, check=False, timeout=120, cwd=cwd
    )


def _alerts() -> list[str]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule]


def test_promtool_accepts_the_rule_file() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in result.stdout


def test_every_alert_fires_and_clears_under_promtool() -> None:
    result = _promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rule_tests_make_every_alert_fire_then_clear() -> None:
    """Each alert has a case where it fires and a later one, in the same series, where it has cleared."""
    tests: list[dict[str, Any]] = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    covered: set[str] = set()
    for case in tests:
        by_alert: dict[str, list[tuple[str, bool]]] = {}
        for check in case.get("alert_rule_test", []):
            by_alert.setdefault(check["alertname"], []).append(
                (check["eval_time"], bool(check["exp_alerts"]))
            )
        for alert, checks in by_alert.items():
            ordered = [fires for _, fires in sorted(checks, key=lambda c: _minutes(c[0]))]
            if True in ordered and False in ordered[ordered.index(True) :]:
                covered.add(alert)
    assert set(_alerts()) <= covered, f"alerts never shown to fire and clear: {set(_alerts()) - covered}"


def _minutes(duration: str) -> float:
    units = {"s": 1 / 60, "m": 1, "h": 60}
    return float(duration[:-1]) * units[duration[-1]]


def test_promtool_fails_a_rule_that_no_longer_fires_in_time(tmp_path: Path) -> None:
    """The unit tests can fail: the same tests over a rule waiting an hour instead of 15 minutes."""
    slow = RULES.read_text().replace("for: 15m", "for: 1h", 1)
    assert slow != RULES.read_text()
    (tmp_path / "deploy" / "prometheus").mkdir(parents=True)
    (tmp_path / "deploy" / "prometheus" / RULES.name).write_text(slow)
    (tmp_path / "tests" / "prometheus").mkdir(parents=True)
    (tmp_path / "tests" / "prometheus" / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    result = _promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path / "tests" / "prometheus")
    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr


@pytest.mark.parametrize(("duration", "minutes"), [("90s", 1.5), ("17m", 17), ("2h", 120)])
def test_eval_times_are_read_in_minutes(duration: str, minutes: float) -> None:
    assert _minutes(duration) == minutes
