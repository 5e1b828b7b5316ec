"""Tokenizer drift end to end: the reconciler records each prefix's token count with the engine version
that counted it; when the same prefix TEXT counts materially differently under a new version, it logs
`tokenizer_drift`, appends the event, sets the metric, and `warmer lint` on that database reports it.

Fake engine and fake clock (from the reconciler tests), a real SqlStore on a temp SQLite file, the real
offline prefix source (tiny-demo profile + example agent) as the "new engine", and the real CLI.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from tests.unit.prompt_helpers import AGENTS_DIR, MODELS_DIR
from tests.unit.reconciler_fakes import FakeClock, FakeEngine
from warmer.adapters.store import SqlStore, read_prefix_token_history
from warmer.cli.lint import lint_command
from warmer.config.agents import load_agent_specs
from warmer.config.profiles import load_profiles
from warmer.config.tokenizer import offline_engine_version
from warmer.core.agents import AgentSpec
from warmer.core.errors import StoreUnavailable
from warmer.core.model import BoxSpec, EngineKind, LoggedEvent, ModelProfile, Prefix, prefix_hash
from warmer.root.metrics import Metrics
from warmer.root.reconcile import OfflinePrefixSource
from warmer.service.reconciler import ComputedPrefix, PrefixSource, Reconciler

AGENT = "outbound-sales"
MODEL = "tiny-demo"
OLD_VERSION = "offline:tiny-demo:tiny-demo.tokenizer.json@000000000000"


class OldEngineSource:
    """The same prefix text as today, counted by an "older tokenizer" to `today / factor` tokens."""

    def __init__(self, today: ComputedPrefix, factor: float) -> None:
        self.today = today
        self.factor = factor

    async def __call__(self, spec: AgentSpec, profile: ModelProfile) -> ComputedPrefix:
        prefix = self.today.prefix
        assert prefix.token_ids is not None
        count = round(prefix.token_count / self.factor)
        ids = (
            prefix.token_ids[:count]
            if count <= prefix.token_count
            else prefix.token_ids + (5,) * (count - prefix.token_count)
        )
        return ComputedPrefix(Prefix(prefix.text, count, ids, prefix.model), OLD_VERSION)


def reconciler(url: str, source: PrefixSource, metrics: Metrics) -> tuple[Reconciler, SqlStore]:
    profiles = load_profiles(MODELS_DIR)
    agents = load_agent_specs(AGENTS_DIR)
    store = SqlStore.from_url(url)
    box = BoxSpec(id="b1", base_url="http://b1:8080", engine=EngineKind.LLAMACPP, model=MODEL, slots=2)
    return (
        Reconciler(
            engine=FakeEngine(["b1"]),
            store=store,
            clock=FakeClock(),
            boxes=[box],
            profiles=profiles,
            agents={AGENT: agents[AGENT]},
            prefix_source=source,
            observer=metrics.reconcile,
        ),
        store,
    )


def lint_json(tmp_path: Path, url: str) -> dict[str, object]:
    config = tmp_path / "warmer.toml"
    config.write_text(
        f'[database]\nurl = "{url}"\n[fleet]\nmodels_dir = "{MODELS_DIR}"\nagents_dir = "{AGENTS_DIR}"\n'
    )
    result = CliRunner().invoke(lint_command, ["--config", str(config), AGENT, "--json"])
    (report,) = json.loads(result.stdout)
    assert isinstance(report, dict)
    # Drift is an error-level finding: it fails the run like any other error (the agent is otherwise clean).
    assert result.exit_code == (1 if drift_findings(report) else 0), result.output
    return report


def drift_findings(report: dict[str, object]) -> list[dict[str, object]]:
    findings = report["findings"]
    assert isinstance(findings, list)
    return [f for f in findings if f["code"] == "tokenizer-drift"]


@dataclass
class Upgrade:
    metrics: Metrics  # the restarted daemon's
    events: list[LoggedEvent]  # tokenizer_drift lines in the store's event log
    logs: list[MutableMapping[str, Any]]  # tokenizer_drift structured log events of the restarted daemon
    today: ComputedPrefix  # what the new tokenizer computed


async def upgrade_scenario(url: str, factor: float) -> Upgrade:
    """Daemon on the old tokenizer, then restarted on the new one; returns the new daemon's metrics, its
    captured log events and the prefix it computed."""
    profile = load_profiles(MODELS_DIR)[MODEL]
    today = await OfflinePrefixSource()(load_agent_specs(AGENTS_DIR)[AGENT], profile)
    assert today.engine_version == offline_engine_version(profile) != OLD_VERSION

    before, store = reconciler(url, OldEngineSource(today, factor), Metrics(CollectorRegistry()))
    await before.tick()
    await before.wait_idle()
    await store.close()

    metrics = Metrics(CollectorRegistry())
    after, store = reconciler(url, OfflinePrefixSource(), metrics)
    with structlog.testing.capture_logs() as logs:
        await after.tick()
        await after.wait_idle()
    events = [e for e in await store.events(limit=1000) if e.kind == "tokenizer_drift"]
    await store.close()
    return Upgrade(metrics, events, [log for log in logs if log["event"] == "tokenizer_drift"], today)


def test_an_8_percent_jump_after_an_upgrade_raises_event_metric_log_and_lint_finding(
    store_url: str, tmp_path: Path
) -> None:
    upgrade = asyncio.run(upgrade_scenario(store_url, factor=1.08))
    metrics, today = upgrade.metrics, upgrade.today
    old_count = round(today.prefix.token_count / 1.08)

    (event,) = upgrade.events
    (log,) = upgrade.logs
    assert event.agent_id == AGENT
    assert event.prefix_hash == today.prefix.hash
    detail = event.detail
    assert detail["engine_version_before"] == OLD_VERSION
    assert detail["engine_version_after"] == today.engine_version
    assert (detail["tokens_before"], detail["tokens_after"]) == (old_count, today.prefix.token_count)
    assert detail["change"] == pytest.approx(today.prefix.token_count / old_count - 1, abs=1e-6)
    assert detail["change"] == pytest.approx(0.08, abs=0.001)
    assert log["log_level"] == "warning"
    assert log["agent"] == AGENT
    assert log["model"] == MODEL
    assert log["change_pct"] == pytest.approx(8.0, abs=0.1)

    labels = {"agent": AGENT, "model": MODEL}
    ratio = metrics.registry.get_sample_value("warmer_tokenizer_drift_ratio", labels)
    assert ratio == pytest.approx(0.08, abs=0.001)
    assert metrics.registry.get_sample_value("warmer_tokenizer_drift_total", {"model": MODEL}) == 1

    (finding,) = drift_findings(lint_json(tmp_path, store_url))
    assert finding["severity"] == "error"
    assert f"{today.prefix.token_count} tokens on {today.engine_version}" in str(finding["message"])
    assert f"{old_count} on {OLD_VERSION}" in str(finding["message"])


@pytest.mark.parametrize("factor", [1.01, 0.99])
def test_a_one_percent_change_raises_nothing(store_url: str, tmp_path: Path, factor: float) -> None:
    upgrade = asyncio.run(upgrade_scenario(store_url, factor=factor))
    metrics, today = upgrade.metrics, upgrade.today
    assert upgrade.events == []
    assert upgrade.logs == []
    assert metrics.registry.get_sample_value("warmer_tokenizer_drift_total", {"model": MODEL}) is None
    assert drift_findings(lint_json(tmp_path, store_url)) == []
    # the history holds both versions: the check ran against them and judged the change immaterial
    history = read_prefix_token_history(store_url, [(MODEL, prefix_hash(today.prefix.text))])
    assert {h.engine_version for h in history[(MODEL, prefix_hash(today.prefix.text))]} == {
        OLD_VERSION,
        today.engine_version,
    }


def test_history_is_keyed_by_the_prefix_text_not_its_token_ids(store_url: str) -> None:
    async def scenario() -> None:
        store = SqlStore.from_url(store_url)
        text = "<|im_start|>system\nYou are Maya."
        await store.record_prefix("a", "s1", Prefix(text, 3, (1, 2, 3), MODEL), engine_version="v1", at=1.0)
        await store.record_prefix(
            "a", "s1", Prefix(text, 4, (1, 2, 3, 4), MODEL), engine_version="v2", at=2.0
        )
        await store.record_prefix(
            "b", "s1", Prefix("other text", 9, None, MODEL), engine_version="v2", at=3.0
        )
        history = await store.prefix_token_history(MODEL, prefix_hash(text))
        assert [(h.engine_version, h.token_count, h.at) for h in history] == [("v1", 3, 1.0), ("v2", 4, 2.0)]
        assert await store.prefix_token_history("other-model", prefix_hash(text)) == []
        await store.close()

    asyncio.run(scenario())


def test_lint_never_creates_a_database(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "warmer.db"
    url = f"sqlite:///{missing}"
    report = lint_json(tmp_path, url)
    assert drift_findings(report) == []
    assert not missing.parent.exists()
    with pytest.raises(StoreUnavailable):
        read_prefix_token_history(url, [(MODEL, "x")])
