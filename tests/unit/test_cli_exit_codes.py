"""One exit code per kind of failure, the same in every command: an invalid configuration is
`Exit.CONFIG` (3) whether `check-config`, `serve`, `lint`, `render`, `warm`, `status` or `db upgrade`
reads it; a wrong command line is click's 2; "the answer is no" is 1; something that does not answer is 4."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from warmer.cli import main
from warmer.cli.exits import Exit

pytestmark = pytest.mark.usefixtures("no_warmer_env")


@pytest.fixture
def broken_config(tmp_path: Path) -> Path:
    """A config with one invalid field (a negative port) and an agents directory."""
    (tmp_path / "agents").mkdir()
    config = tmp_path / "warmer.toml"
    config.write_text('[api]\nport = -1\n\n[fleet]\nagents_dir = "agents"\n')
    return config


@pytest.mark.parametrize(
    "command",
    [
        ["check-config"],
        ["serve"],
        ["lint"],
        ["render", "anyone"],
        ["warm", "--box", "b1", "--agent", "anyone"],
        ["status"],
        ["db", "upgrade"],
    ],
    ids=lambda command: command[0] if command[0] != "db" else "db-upgrade",
)
def test_an_invalid_config_is_the_same_exit_code_in_every_command(
    broken_config: Path, command: list[str]
) -> None:
    result = CliRunner().invoke(main, ["--config", str(broken_config), *command])
    assert result.exit_code == Exit.CONFIG == 3, result.output
    assert "api.port" in result.output, "the problem is named by its field path"


def test_the_codes_are_distinct_per_kind_of_failure() -> None:
    assert [code.value for code in Exit] == [0, 1, 2, 3, 4]
    assert CliRunner().invoke(main, ["check-config", "--no-such-option"]).exit_code == Exit.USAGE
