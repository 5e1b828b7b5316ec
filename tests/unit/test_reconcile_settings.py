"""`[reconcile] retire_idle_after_seconds` reaches the planner the root builds, 0 meaning "never retire";
`[dialer] precall_hold_seconds` reaches the reconciler's config."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from warmer.config.settings import Settings, load_settings
from warmer.core.errors import ConfigError
from warmer.core.model import BoxSpec, EngineKind, ModelProfile
from warmer.core.plan_actions import WarmReason
from warmer.core.planner import Desired, PlannerConfig, PrefixRef, active_agents
from warmer.root.reconcile import reconciler_config
from warmer.service.reconciler import ReconcilerConfig

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("WARMER_"):
            monkeypatch.delenv(name)


def _settings_from(tmp_path: Path, reconcile_table: str) -> Settings:
    path = tmp_path / "warmer.toml"
    path.write_text(f"[reconcile]\n{reconcile_table}\n")
    return load_settings(path)


def _planner(settings: Settings) -> PlannerConfig:
    return reconciler_config(settings).planner


def _desired(last_seen: float) -> Desired:
    """One agent on one box, last seen at `last_seen`."""
    box = BoxSpec(id="b1", base_url="http://127.0.0.1:8091", engine=EngineKind.LLAMACPP, model="m", slots=2)
    profile = ModelProfile(name="m", engine=EngineKind.LLAMACPP)
    return Desired(
        boxes={box.id: box},
        profiles={profile.name: profile},
        agents={"agent-a": PrefixRef(hash="h1", tokens=1000)},
        assignment={"agent-a": (box.id,)},
        last_activity={"agent-a": last_seen},
    )


def test_the_file_value_reaches_the_planner(tmp_path: Path) -> None:
    settings = _settings_from(tmp_path, "retire_idle_after_seconds = 1800.0")
    assert _planner(settings).retire_idle_after_seconds == 1800.0


def test_zero_means_keep_every_assigned_agent_warm_forever(tmp_path: Path) -> None:
    settings = _settings_from(tmp_path, "retire_idle_after_seconds = 0")
    config = _planner(settings)
    assert config.retire_idle_after_seconds is None
    # A day idle and still kept warm.
    assert active_agents(_desired(last_seen=0.0), now=86400.0, config=config) == {
        "agent-a": WarmReason.ASSIGNED
    }


def test_an_idle_agent_retires_after_the_configured_time(tmp_path: Path) -> None:
    config = _planner(_settings_from(tmp_path, "retire_idle_after_seconds = 600"))
    desired = _desired(last_seen=1000.0)
    assert active_agents(desired, now=1000.0 + 600.0, config=config) == {"agent-a": WarmReason.ASSIGNED}
    assert active_agents(desired, now=1000.0 + 601.0, config=config) == {}


def test_the_default_is_the_planners_default() -> None:
    assert Settings().reconcile.retire_idle_after_seconds == PlannerConfig().retire_idle_after_seconds
    assert _planner(Settings()).retire_idle_after_seconds == PlannerConfig().retire_idle_after_seconds


def test_the_environment_overrides_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMER_RECONCILE__RETIRE_IDLE_AFTER_SECONDS", "120")
    settings = _settings_from(tmp_path, "retire_idle_after_seconds = 1800.0")
    assert _planner(settings).retire_idle_after_seconds == 120.0


def test_a_negative_value_is_refused_by_field_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _settings_from(tmp_path, "retire_idle_after_seconds = -1")
    assert [path for path, _ in caught.value.problems] == ["reconcile.retire_idle_after_seconds"]


def test_the_example_config_sets_it_explicitly() -> None:
    example = load_settings(REPO / "config" / "example.toml")
    assert "retire_idle_after_seconds" in example.reconcile.model_fields_set


def _dialer_settings(tmp_path: Path, dialer_table: str) -> Settings:
    path = tmp_path / "warmer.toml"
    path.write_text(f"[dialer]\n{dialer_table}\n")
    return load_settings(path)


def test_the_precall_hold_from_the_file_reaches_the_reconciler_config(tmp_path: Path) -> None:
    settings = _dialer_settings(tmp_path, "precall_hold_seconds = 15.5")
    assert reconciler_config(settings).precall_hold_seconds == 15.5


def test_the_precall_hold_default_is_the_reconcilers_default() -> None:
    assert Settings().dialer.precall_hold_seconds == ReconcilerConfig().precall_hold_seconds
    assert reconciler_config(Settings()).precall_hold_seconds == ReconcilerConfig().precall_hold_seconds


def test_the_environment_overrides_the_precall_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMER_DIALER__PRECALL_HOLD_SECONDS", "90")
    settings = _dialer_settings(tmp_path, "precall_hold_seconds = 15.5")
    assert reconciler_config(settings).precall_hold_seconds == 90.0


@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_non_positive_precall_hold_is_refused_by_field_path(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _dialer_settings(tmp_path, f"precall_hold_seconds = {value}")
    assert [path for path, _ in caught.value.problems] == ["dialer.precall_hold_seconds"]


def test_the_fleet_warming_budget_reaches_the_reconciler_config(tmp_path: Path) -> None:
    settings = _settings_from(
        tmp_path,
        "fleet_warm_tokens_per_second = 50000\nfleet_warm_max_in_flight = 16\n"
        "fleet_warm_max_wait_seconds = 30\nfleet_warm_share = 0.5",
    )
    budget = reconciler_config(settings).fleet_budget
    assert (budget.tokens_per_second, budget.max_in_flight, budget.max_wait_seconds, budget.warm_share) == (
        50_000.0,
        16,
        30.0,
        0.5,
    )


def test_a_zero_fleet_budget_means_derived_from_the_boxes(tmp_path: Path) -> None:
    budget = reconciler_config(_settings_from(tmp_path, "fleet_warm_tokens_per_second = 0")).fleet_budget
    assert budget.tokens_per_second is None
    assert ReconcilerConfig().fleet_budget.max_in_flight == budget.max_in_flight  # the same defaults


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("fleet_warm_max_in_flight = 0", "reconcile.fleet_warm_max_in_flight"),
        ("fleet_warm_share = 1.5", "reconcile.fleet_warm_share"),
        ("fleet_warm_tokens_per_second = -1", "reconcile.fleet_warm_tokens_per_second"),
        ("fleet_warm_max_wait_seconds = 0", "reconcile.fleet_warm_max_wait_seconds"),
    ],
)
def test_a_bad_fleet_budget_is_refused_by_field_path(tmp_path: Path, line: str, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        _settings_from(tmp_path, line)
