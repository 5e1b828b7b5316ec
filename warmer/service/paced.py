"""Fleet-wide rounds of requests started a few at a time, so the rest of the event loop runs between.

`asyncio.gather` over every box starts each box's request in the same turn of the event loop: the whole
round's request building (httpx: URL, headers, the connection pool) runs back to back, and the dialer's
pre-call asks that arrived meanwhile wait for all of it (at 125 boxes a health round held the loop for
tens of milliseconds, BENCHMARKS.md "Pre-call answers with many agents"). `gather_paced` starts `batch`
of them, then yields one turn of the loop (its ready callbacks and socket events: the asks) before the
next `batch`. The same coroutines run, with the same results, in the same order."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

# Requests started per turn of the loop: a few milliseconds of request building at most.
START_BATCH = 8


async def gather_paced(
    run: Callable[[T], Awaitable[R]], items: Iterable[T], *, batch: int = START_BATCH
) -> list[R]:
    """`asyncio.gather(*(run(item) for item in items))`, started `batch` at a time with one turn of the
    event loop between batches; results in the order of `items`. The first exception is raised as by
    `gather` (the others run on); cancelled, it cancels what it started."""
    if batch < 1:
        raise ValueError("batch must be >= 1")
    tasks: list[asyncio.Future[R]] = []
    try:
        for index, item in enumerate(items):
            if index and index % batch == 0:
                await asyncio.sleep(0)  # one turn: what else is ready runs before the next batch
            tasks.append(asyncio.ensure_future(run(item)))
        return list(await asyncio.gather(*tasks))
    except asyncio.CancelledError:
        for task in tasks:
            task.cancel()
        raise
