"""The root follows KV cache events only when a configured box names them (`warmer.root.kv_events`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.unit.test_daemon import FakeStore, free_port
from warmer.config.profiles import load_profile_set
from warmer.config.settings import Settings
from warmer.root.app import build
from warmer.root.database import ManagedStore


def task_names(tmp_path: Path, box: dict[str, object]) -> tuple[str, ...]:
    settings = Settings(
        api={"host": "127.0.0.1", "port": free_port()},
        database={"state_dir": str(tmp_path)},
        fleet={"boxes": [box]},
    )

    def factory(_: Settings) -> ManagedStore:
        return FakeStore()  # type: ignore[return-value]

    daemon = build(settings, profiles=load_profile_set(), store_factory=factory, prepare=lambda s: None)

    async def wire() -> tuple[str, ...]:
        await daemon.open()
        try:
            return daemon.supervisor.task_names
        finally:
            await daemon.close()

    return asyncio.run(wire())


BOX = {"id": "v1", "base_url": "http://127.0.0.1:8000", "engine": "vllm", "model": "tiny-vllm-cpu"}


@pytest.mark.parametrize(
    ("box", "follows"),
    [
        ({**BOX, "kv_events": {"endpoint": "tcp://127.0.0.1:5557"}}, True),
        (BOX, False),
    ],
    ids=["kv_events", "none"],
)
def test_the_kv_events_task_runs_only_for_a_box_that_names_its_stream(
    tmp_path: Path, box: dict[str, object], follows: bool
) -> None:
    names = task_names(tmp_path, box)
    assert "reconciler" in names
    assert ("kv-events" in names) is follows
