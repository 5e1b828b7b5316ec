"""The `loop-lag` root task reports how much later than due its timer fired: the time the event loop was
held by other work, which every pre-call ask arriving meanwhile waits too."""

from __future__ import annotations

import asyncio

import pytest

from warmer.service.loop_lag import sample_loop_lag


class HeldClock:
    """A clock whose sleeps end late by the next of `held` (the loop was busy elsewhere that long)."""

    def __init__(self, held: list[float], stopping: asyncio.Event) -> None:
        self.t = 100.0
        self._held = held
        self._stopping = stopping

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds + self._held.pop(0)
        if not self._held:
            self._stopping.set()


def test_each_timer_reports_how_late_it_fired() -> None:
    seen: list[float] = []

    async def scenario() -> None:
        stopping = asyncio.Event()
        clock = HeldClock([0.0, 0.25, 0.0005, 0.0], stopping)
        await sample_loop_lag(clock, 0.1, seen.append, stopping)

    asyncio.run(scenario())
    assert seen == pytest.approx([0.0, 0.25, 0.0005, 0.0])


def test_the_period_must_be_positive() -> None:
    async def scenario() -> None:
        stopping = asyncio.Event()
        await sample_loop_lag(HeldClock([0.0], stopping), 0, lambda _: None, stopping)

    with pytest.raises(ValueError, match="period"):
        asyncio.run(scenario())


def test_a_stop_ends_the_task() -> None:
    async def scenario() -> None:
        stopping = asyncio.Event()
        stopping.set()
        await sample_loop_lag(HeldClock([], stopping), 0.1, lambda _: None, stopping)

    asyncio.run(scenario())
