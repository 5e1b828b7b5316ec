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
    assert frozen == gc.get_freeze_count() > 0
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
