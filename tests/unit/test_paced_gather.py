"""Fleet-wide request rounds start a few at a time (`gather_paced`): the event loop's other callbacks (the
dialer's pre-call asks) run between batches instead of after the whole round's request building."""

from __future__ import annotations

import asyncio

import pytest

from warmer.service.paced import gather_paced


def run_with_neighbour(items: list[int], batch: int) -> list[object]:
    """The order in which the round's coroutines start and a neighbour task (an ask) gets a turn."""
    order: list[object] = []

    async def scenario() -> list[int]:
        done = False

        async def neighbour() -> None:
            while not done:
                order.append("turn")
                await asyncio.sleep(0)

        async def one(item: int) -> int:
            order.append(item)
            await asyncio.sleep(0)
            return item * 10

        beside = asyncio.ensure_future(neighbour())
        await asyncio.sleep(0)  # the neighbour is running
        try:
            return await gather_paced(one, items, batch=batch)
        finally:
            done = True
            await beside

    assert asyncio.run(scenario()) == [item * 10 for item in items]
    return order


def starts_between_turns(order: list[object]) -> list[int]:
    runs, run = [], 0
    for entry in order:
        if entry == "turn":
            runs.append(run)
            run = 0
        else:
            run += 1
    return [*runs, run]


def test_a_round_starts_at_most_a_batch_between_two_turns_of_the_loop() -> None:
    order = run_with_neighbour(list(range(20)), batch=4)
    assert [entry for entry in order if entry != "turn"] == list(range(20))  # all of them, in order
    assert max(starts_between_turns(order)) <= 4


def test_gather_would_start_the_whole_round_in_one_turn() -> None:
    """What the pacing replaces: with one batch as large as the round, every start is back to back."""
    order = run_with_neighbour(list(range(20)), batch=20)
    assert max(starts_between_turns(order)) == 20


def test_the_first_exception_is_raised_and_a_cancel_cancels_what_was_started() -> None:
    async def failing() -> None:
        async def one(item: int) -> int:
            if item == 3:
                raise ValueError("box 3 failed")
            return item

        with pytest.raises(ValueError, match="box 3"):
            await gather_paced(one, range(6), batch=2)

    asyncio.run(failing())

    started: list[int] = []
    cancelled: list[int] = []

    async def cancelling() -> None:
        gate = asyncio.Event()

        async def one(item: int) -> None:
            started.append(item)
            try:
                await gate.wait()
            except asyncio.CancelledError:
                cancelled.append(item)
                raise

        round_ = asyncio.ensure_future(gather_paced(one, range(10), batch=2))
        for _ in range(3):
            await asyncio.sleep(0)
        round_.cancel()
        with pytest.raises(asyncio.CancelledError):
            await round_

    asyncio.run(cancelling())
    assert started
    assert sorted(cancelled) == sorted(started)


def test_batch_must_be_positive() -> None:
    async def one(item: int) -> int:
        return item

    with pytest.raises(ValueError, match="batch"):
        asyncio.run(gather_paced(one, [1], batch=0))
