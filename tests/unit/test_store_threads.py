"""The store's transactions run on threads of its own, and lease heartbeats on a lane of their own: a
replica whose default executor is busy (prompts being tokenized at start-up, any `asyncio.to_thread`) or
whose store threads are all taken (slow transactions under load) still renews its leases, instead of
letting them lapse and cutting its own warm-ups short."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

from tests.unit.reconciler_fakes import boxes
from warmer.adapters.store import SqlStore, upgrade_database
from warmer.adapters.store.coordination import SqlCoordination
from warmer.adapters.store.store import STORE_THREADS
from warmer.core.leases import LeaseConfig

T = TypeVar("T")
# Only a guard against hanging forever: the calls below answer in milliseconds unless they queue behind
# the blocked threads, which never finish until the test lets them.
NEVER_SECONDS = 30.0


async def answered(call: Awaitable[T]) -> T:
    return await asyncio.wait_for(call, NEVER_SECONDS)


def store_on(tmp_path: Path) -> tuple[SqlStore, SqlCoordination]:
    url = f"sqlite:///{tmp_path / 'warmer.db'}"
    upgrade_database(url)
    store = SqlStore.from_url(url)
    return store, SqlCoordination(store)


def test_store_work_and_heartbeats_do_not_queue_behind_the_default_executor(tmp_path: Path) -> None:
    store, coordination = store_on(tmp_path)

    async def scenario() -> None:
        await store.sync_boxes(boxes("b1"))
        release = threading.Event()
        # more blocked calls than the loop's default executor has threads (min(32, cpus + 4))
        blocked = [asyncio.ensure_future(asyncio.to_thread(release.wait)) for _ in range(40)]
        try:
            view = await answered(coordination.heartbeat("r1", ["b1"], at=0.0, config=LeaseConfig()))
            assert view.held_by("r1") == {"b1"}
            assert await answered(store.list_warm()) == []
        finally:
            release.set()
            await asyncio.gather(*blocked)

    asyncio.run(scenario())


def test_a_heartbeat_does_not_queue_behind_the_stores_own_busy_threads(tmp_path: Path) -> None:
    store, coordination = store_on(tmp_path)

    async def scenario() -> None:
        await store.sync_boxes(boxes("b1", "b2"))
        release = threading.Event()
        # every store thread taken, and more waiting (slow transactions, a database under load)
        blocked = [asyncio.ensure_future(store._in_thread(release.wait)) for _ in range(STORE_THREADS + 4)]
        try:
            view = await answered(coordination.heartbeat("r1", ["b1", "b2"], at=0.0, config=LeaseConfig()))
            assert view.held_by("r1") == {"b1", "b2"}
            await answered(coordination.release("r1"))
        finally:
            release.set()
            await asyncio.gather(*blocked)
        assert (await store.list_warm()) == []

    asyncio.run(scenario())
