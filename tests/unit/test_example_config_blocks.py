"""config/example.toml's commented-out sections are real settings with the real defaults.

An operator uncomments a block to start from it, so each one must validate as written and show the values
the daemon uses when the block stays commented out.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from pydantic import BaseModel

from warmer.config.loop_settings import (
    CapacitySettings,
    DialerSettings,
    GateSettings,
    HitRateSettings,
    UsageSettings,
)
from warmer.config.server_settings import ReplicaSettings

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "example.toml"

# `# key = value` and `# [table]` lines (prose comments do not match).
_SETTING_LINE = re.compile(r"^# (\[[a-z_.]+\]|[a-z_]+ = .*)$")


def _commented_block(table: str) -> str:
    """The TOML of a commented-out `# [table]` block: its setting lines, up to the next blank line."""
    lines = EXAMPLE.read_text().splitlines()
    start = lines.index(f"# [{table}]")
    block = []
    for line in lines[start:]:
        if not line.strip():
            break
        match = _SETTING_LINE.match(line)
        if match:
            block.append(match.group(1))
    return "\n".join(block)


@pytest.mark.parametrize(
    ("table", "section"),
    [
        ("hitrate", HitRateSettings),
        ("dialer", DialerSettings),
        ("capacity", CapacitySettings),
        ("usage", UsageSettings),
        ("replicas", ReplicaSettings),
        ("gate", GateSettings),
    ],
)
def test_commented_block_validates_and_shows_the_defaults(table: str, section: type[BaseModel]) -> None:
    values = tomllib.loads(_commented_block(table))[table]
    parsed = section.model_validate(values)
    defaults = section()
    optional_unset = {name for name in section.model_fields if getattr(defaults, name) is None}
    shown = set(values) - optional_unset
    assert shown == set(section.model_fields) - optional_unset, "every setting with a default is shown"
    for name in shown:
        assert getattr(parsed, name) == getattr(defaults, name), f"{table}.{name} differs from the default"
    for name in optional_unset:
        assert name in values, f"{table}.{name} is shown as an example"


def test_the_example_leaves_them_commented_out() -> None:
    data = tomllib.loads(EXAMPLE.read_text())
    assert "hitrate" not in data
    assert "dialer" not in data
