"""A `warmer serve` process freezes its start-up heap out of the garbage collector's full collections
(`warmer.root.heap`): they walk only what the daemon made since, not the ~250,000 objects of modules,
settings, agents and the app that live as long as the process."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from warmer.root.heap import freeze_startup_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session collects as before


def test_what_is_alive_is_frozen_and_what_is_made_later_is_not(unfrozen: None) -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self  # a reference cycle: only the collector frees it

    kept = Node()
    assert gc.get_freeze_count() == 0
    frozen = freeze_startup_heap()
    # (not equal to a later count: frozen objects are still freed, by other threads of the session too)
    assert frozen > 0
    assert gc.get_freeze_count() > 0
    assert not any(obj is kept for obj in gc.get_objects())  # out of every generation's walk

    later = Node()
    assert any(obj is later for obj in gc.get_objects())  # made after start-up: collected as usual
    del later
    assert gc.collect() >= 1  # the cycle made after the freeze is freed


def test_garbage_left_by_start_up_is_collected_before_the_freeze(unfrozen: None) -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self

    Node()  # unreachable at once, but a cycle: only a collection frees it
    freeze_startup_heap()
    gc.unfreeze()
    assert gc.collect() == 0  # nothing was frozen that was garbage already


def test_the_heap_is_frozen_again_after_the_first_pass_that_finds_the_fleet_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the daemon builds for a fleet (prefixes, placement, a series per box and agent) is frozen once
    the fleet is first ready, once; the task then waits for the stop like every root task."""
    import asyncio

    import warmer.root.heap as heap

    froze: list[str] = []
    monkeypatch.setattr(heap, "freeze_startup_heap", lambda: froze.append("froze") or 1)
    ready = {"now": False}

    async def scenario() -> None:
        stopping = asyncio.Event()
        passed = asyncio.Event()

        async def pass_done() -> None:
            await passed.wait()

        task = asyncio.ensure_future(heap.freeze_when_fleet_ready(lambda: ready["now"], pass_done, stopping))
        for _ in range(3):
            await asyncio.sleep(0)
        passed.set()  # a pass, the fleet not ready yet
        passed.clear()
        for _ in range(3):
            await asyncio.sleep(0)
        assert froze == []
        ready["now"] = True
        passed.set()  # the pass that finds it ready
        for _ in range(3):
            await asyncio.sleep(0)
        assert froze == ["froze"]
        assert not task.done()  # a root task runs until the stop
        for _ in range(3):
            await asyncio.sleep(0)
        assert froze == ["froze"]  # once
        stopping.set()
        await task

    asyncio.run(scenario())


def test_a_stop_before_the_fleet_is_ready_ends_the_task_without_freezing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    import warmer.root.heap as heap

    froze: list[str] = []
    monkeypatch.setattr(heap, "freeze_startup_heap", lambda: froze.append("froze") or 1)

    async def scenario() -> None:
        stopping = asyncio.Event()
        never = asyncio.Event()
        task = asyncio.ensure_future(heap.freeze_when_fleet_ready(lambda: False, never.wait, stopping))
        await asyncio.sleep(0)
        stopping.set()
        await task

    asyncio.run(scenario())
    assert froze == []
