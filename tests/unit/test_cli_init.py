"""`warmer init`: the starter config passes the real validation as written, and bad input writes nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from warmer.cli import main
from warmer.config.loader import load_config


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("WARMER_"):
            monkeypatch.delenv(name)


def test_init_writes_a_config_that_loads_with_its_nested_agent(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["init", str(tmp_path), "--box", "http://10.0.0.7:8080"])
    assert result.exit_code == 0, result.output
    loaded = load_config(tmp_path / "warmer.toml")
    assert [(box.id, box.base_url, box.model) for box in loaded.boxes] == [
        ("box-1", "http://10.0.0.7:8080", "tiny-demo")
    ]
    assert list(loaded.agents) == ["example"]
    persona = (tmp_path / "agents" / "example" / "persona.md").read_text()
    assert loaded.agents["example"].blocks[0].text == persona
    assert loaded.settings.database.is_embedded
    assert loaded.settings.database.state_dir == tmp_path / "state"
    assert loaded.settings.api.binds_loopback
    check = CliRunner().invoke(main, ["check-config", str(tmp_path / "warmer.toml")])
    assert check.exit_code == 0, check.output


def test_init_takes_the_engine_kind_from_the_chosen_profile(tmp_path: Path) -> None:
    args = [
        "init",
        str(tmp_path),
        "--model",
        "dense-vllm",
        "--box",
        "http://a:8000",
        "--box",
        "http://b:8000",
    ]
    result = CliRunner().invoke(main, [*args, "--port", "9001"])
    assert result.exit_code == 0, result.output
    loaded = load_config(tmp_path / "warmer.toml")
    assert [(box.id, box.engine.value) for box in loaded.boxes] == [("box-1", "vllm"), ("box-2", "vllm")]
    assert loaded.agents["example"].model == "dense-vllm"
    assert loaded.settings.api.port == 9001


def test_init_refuses_to_overwrite_unless_forced(tmp_path: Path) -> None:
    (tmp_path / "warmer.toml").write_text("# mine\n")
    result = CliRunner().invoke(main, ["init", str(tmp_path)])
    assert result.exit_code == 1
    assert "warmer.toml" in result.output
    assert (tmp_path / "warmer.toml").read_text() == "# mine\n"
    assert not (tmp_path / "agents").exists()
    forced = CliRunner().invoke(main, ["init", str(tmp_path), "--force"])
    assert forced.exit_code == 0, forced.output
    load_config(tmp_path / "warmer.toml")


@pytest.mark.parametrize(
    ("args", "field"),
    [(["--model", "big"], "--model"), (["--box", "ftp://x"], "--box"), (["--box", "http://x/?q=1"], "--box")],
)
def test_bad_input_names_the_option_and_writes_nothing(tmp_path: Path, args: list[str], field: str) -> None:
    result = CliRunner().invoke(main, ["init", str(tmp_path / "new"), *args])
    assert result.exit_code == 2
    assert field in result.output
    assert not (tmp_path / "new").exists()
