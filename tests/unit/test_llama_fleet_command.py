"""The llama-server command line the testbed fleet builds: the host prompt cache is a knob (0 = off)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.fleet import LlamaFleet


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_the_host_prompt_cache_is_off_by_default_so_evictions_are_real() -> None:
    fleet = LlamaFleet(1, binary=Path("llama-server"), model=Path("m.gguf"), slots=2, ctx_per_slot=4096)
    command = fleet.command(8080)
    assert flag(command, "--cache-ram") == "0"
    assert flag(command, "--ctx-size") == "8192"
    assert command.count("--cache-ram") == 1


def test_cache_ram_gives_each_box_a_host_prompt_cache_of_that_many_mib() -> None:
    fleet = LlamaFleet(1, binary=Path("llama-server"), model=Path("m.gguf"), cache_ram_mib=256)
    command = fleet.command(8080)
    assert flag(command, "--cache-ram") == "256"
    assert command.count("--cache-ram") == 1


def test_a_negative_cache_ram_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="cache_ram_mib"):
        LlamaFleet(1, binary=Path("llama-server"), model=Path("m.gguf"), cache_ram_mib=-1)
