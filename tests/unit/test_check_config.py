"""`warmer check-config`: the example passes; planted mistakes are all reported by field path, exit 1."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
from click.testing import CliRunner

from warmer.cli import main
from warmer.cli.exits import Exit
from warmer.config.loader import load_config
from warmer.core.agents import AgentSpec
from warmer.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "config" / "example.toml"

# Three mistakes of three kinds: a bad value, a duplicate box id, and an unknown key.
THREE_MISTAKES = """
[fleet]
models_dir = "{models}"

[[fleet.boxes]]
id = "llama-1"
base_url = "http://127.0.0.1:8091"
engine = "llamacpp"
model = "tiny-demo"

[[fleet.boxes]]
id = "llama-1"
base_url = "http://127.0.0.1:8092"
engine = "llamacpp"
model = "tiny-demo"

[[fleet.boxes]]
id = "llama-3"
base_url = "http://127.0.0.1:8093"
engine = "tensorrt"
model = "tiny-demo"

[reconcile]
interval_secs = 5
"""
EXPECTED_PATHS = ("fleet.boxes[1].id", "fleet.boxes[2].engine", "reconcile.interval_secs")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("WARMER_"):
            monkeypatch.delenv(name)


@pytest.fixture
def broken_config(tmp_path: Path) -> Path:
    path = tmp_path / "broken.toml"
    path.write_text(THREE_MISTAKES.format(models=(REPO / "models").as_posix()))
    return path


def test_example_config_passes() -> None:
    result = CliRunner().invoke(main, ["check-config", str(EXAMPLE)])
    assert result.exit_code == 0, result.output
    assert "config ok" in result.output
    assert "2 boxes" in result.output


def test_example_config_loads_the_demo_fleet() -> None:
    loaded = load_config(EXAMPLE)
    assert [(box.id, box.base_url, box.slots) for box in loaded.boxes] == [
        ("llama-1", "http://127.0.0.1:8091", 2),
        ("llama-2", "http://127.0.0.1:8092", 2),
    ]
    assert loaded.settings.database.is_embedded
    assert loaded.agents, "the example references config/agents"


def test_three_planted_mistakes_are_all_reported(broken_config: Path) -> None:
    result = CliRunner().invoke(main, ["check-config", str(broken_config)])
    assert result.exit_code == Exit.CONFIG == 3
    reported = [line.split(": ", 1)[0] for line in result.stderr.splitlines() if ": " in line]
    for path in EXPECTED_PATHS:
        assert path in reported, result.stderr
    assert "3 problems" in result.stderr


def test_the_real_script_reports_them_too(broken_config: Path) -> None:
    script = shutil.which("warmer", path=str(Path(sys.executable).parent))
    assert script is not None, "the `warmer` console script is installed next to the interpreter"
    env = {key: value for key, value in os.environ.items() if not key.startswith("WARMER_")}
    done = subprocess.run(
        [script, "check-config", str(broken_config)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == Exit.CONFIG
    for path in EXPECTED_PATHS:
        assert f"{path}: " in done.stderr, done.stderr
    ok = subprocess.run(
        [script, "check-config", str(EXAMPLE)], capture_output=True, text=True, env=env, timeout=120
    )
    assert ok.returncode == 0, ok.stderr


def test_config_option_and_env_name_the_file(broken_config: Path) -> None:
    by_option = CliRunner().invoke(main, ["--config", str(EXAMPLE), "check-config"])
    assert by_option.exit_code == 0, by_option.output
    by_env = CliRunner().invoke(main, ["check-config"], env={"WARMER_CONFIG": str(broken_config)})
    assert by_env.exit_code == Exit.CONFIG


def write(tmp_path: Path, boxes: str, extra: str = "") -> Path:
    path = tmp_path / "c.toml"
    path.write_text(f'[fleet]\nmodels_dir = "{(REPO / "models").as_posix()}"\n{extra}\n{boxes}')
    return path


def box(box_id: str, port: int, engine: str = "llamacpp", model: str = "tiny-demo") -> str:
    return (
        f'[[fleet.boxes]]\nid = "{box_id}"\nbase_url = "http://127.0.0.1:{port}"\n'
        f'engine = "{engine}"\nmodel = "{model}"\n'
    )


def problems_of(path: Path) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as caught:
        load_config(path, agent_loader=lambda _: {})
    return caught.value.problems


def test_cross_checks_name_the_offending_box(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        box("a", 1) + box("b", 1) + box("c", 3, engine="vllm") + box("d", 4, model="no-such-model"),
    )
    found = dict(problems_of(path))
    assert set(found) == {"fleet.boxes[1].base_url", "fleet.boxes[2].engine", "fleet.boxes[3].model"}
    assert "tiny-demo" in found["fleet.boxes[3].model"]  # the message lists the known profiles


def test_cross_checks_still_run_when_fields_are_invalid(tmp_path: Path) -> None:
    path = write(tmp_path, box("a", 1) + box("a", 2) + box("c", 3, engine="nope"))
    paths = {p for p, _ in problems_of(path)}
    assert paths == {"fleet.boxes[1].id", "fleet.boxes[2].engine"}


def test_an_open_api_on_a_routable_address_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "", extra='[api]\nhost = "0.0.0.0"\n')
    assert [p for p, _ in problems_of(path)] == ["api.tokens"]


def test_agent_problems_and_unknown_agent_models_are_included(tmp_path: Path) -> None:
    (tmp_path / "agents").mkdir()
    path = write(tmp_path, box("a", 1), extra='agents_dir = "agents"\n')

    def failing(directory: Path) -> Mapping[str, AgentSpec]:
        raise ConfigError([("agents/x.toml: dynamic.template", "placeholder {when} is not declared")])

    with pytest.raises(ConfigError) as caught:
        load_config(path, agent_loader=failing)
    assert caught.value.problems == [
        ("agents/x.toml: dynamic.template", "placeholder {when} is not declared")
    ]

    some_agent = next(iter(load_config(EXAMPLE).agents.values()))
    stray = dataclasses.replace(some_agent, model="no-such-model")
    with pytest.raises(ConfigError) as caught:
        load_config(path, agent_loader=lambda _: {"stray": stray})
    assert [p for p, _ in caught.value.problems] == ["agents.stray.model"]


def test_missing_agents_dir_is_a_problem(tmp_path: Path) -> None:
    path = write(tmp_path, box("a", 1), extra='agents_dir = "nowhere"\n')
    assert [p for p, _ in problems_of(path)] == ["fleet.agents_dir"]
