"""`warmer warm` argument checks: bad combinations exit 2 with a message naming the option, before any I/O."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from warmer.cli import main
from warmer.cli.exits import Exit


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "exactly one of --agent or --prefix-file"),
        (["--agent", "a", "--prefix-file", "{file}"], "exactly one of --agent or --prefix-file"),
        (["--prefix-file", "{file}"], "exactly one of --box"),
        (["--prefix-file", "{file}", "--box", "b", "--base-url", "http://x:1"], "exactly one of --box"),
        (["--prefix-file", "{file}", "--base-url", "http://x:1"], "--base-url needs --engine"),
        (["--agent", "a", "--base-url", "http://x:1", "--engine", "vllm"], "--agent needs --box"),
    ],
)
def test_bad_option_combinations_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    prompt = tmp_path / "p.txt"
    prompt.write_text("hello", encoding="utf-8")
    result = CliRunner().invoke(main, ["warm", *[a.replace("{file}", str(prompt)) for a in args]])
    assert result.exit_code == 2
    assert message in result.output


def test_unreachable_adhoc_box_is_unavailable(tmp_path: Path) -> None:
    prompt = tmp_path / "p.txt"
    prompt.write_text("hello", encoding="utf-8")
    env = {"WARMER_RETRY__ATTEMPTS": "1", "WARMER_ENGINES__CONNECT_TIMEOUT_SECONDS": "0.5"}
    # Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
    args = ["warm", "--base-url", "http://127.0.0.1:9", "--engine", "llamacpp", "--prefix-file", str(prompt)]
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == Exit.UNAVAILABLE
    assert "engine unavailable: adhoc:" in result.output
