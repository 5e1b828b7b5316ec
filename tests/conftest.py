"""Shared pytest fixtures. Keep each block small and self-contained: several areas add fixtures here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testbed.fleet import LlamaFleet
from testbed.llama_build import ensure_llama_server
from testbed.tiny_model import ensure_tiny_model

# -- real llama-server boxes (testbed) ----------------------------------------------------------------
# Never skipped: a missing binary is built (about 9 minutes, once per machine), as CI relies on.


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    return ensure_llama_server()


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    return ensure_tiny_model()


LlamaFleetFactory = Callable[..., LlamaFleet]


@pytest.fixture
def llama_fleet_factory(
    llama_server_binary: Path, tiny_model_path: Path, tmp_path: Path
) -> Iterator[LlamaFleetFactory]:
    """`factory(n, *, slots=1, ctx_per_slot=4096)` starts n healthy boxes; all are stopped at teardown."""
    fleets: list[LlamaFleet] = []

    def start(n: int, *, slots: int = 1, ctx_per_slot: int = 4096) -> LlamaFleet:
        fleet = LlamaFleet(
            n,
            binary=llama_server_binary,
            model=tiny_model_path,
            slots=slots,
            ctx_per_slot=ctx_per_slot,
            log_dir=tmp_path / f"llama-fleet-{len(fleets)}",
        )
        fleets.append(fleet)
        fleet.start()
        return fleet

    yield start
    for fleet in fleets:
        fleet.stop()
